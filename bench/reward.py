"""Benchmark 4: reward verifications/s with 1 and 2 worker processes on MATH-500 gold solutions."""

import argparse
import json
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "math500.jsonl"


def measure(pairs: list[tuple[str, str]], workers: int) -> float:
    from ggpo_offline.generate.rewards import RewardScorer

    with RewardScorer(workers) as scorer:
        scorer.submit(pairs[:8]).get()  # warm-up: worker start and imports are not verification time
        start = time.perf_counter()
        results = scorer.submit(pairs).get()
        seconds = time.perf_counter() - start
    assert sum(r.reward for r in results) == len(pairs), "every gold solution should verify"
    return len(pairs) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    if not args.data.is_file():
        print(f"skipped: {args.data} is absent (MATH-500 is read from ../shared/data)")
        return
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    pairs = [(row["solution"], row["answer"]) for row in rows]
    rates = {workers: measure(pairs, workers) for workers in (1, 2)}
    print(f"{len(pairs)} MATH-500 gold solutions (last \\boxed{{}} vs the answer field)\n")
    print("| workers | verifications/s | ratio vs 1 worker |")
    print("|---:|---:|---:|")
    for workers, rate in rates.items():
        print(f"| {workers} | {rate:,.0f} | {rate / rates[1]:.2f}x |")


if __name__ == "__main__":
    main()
