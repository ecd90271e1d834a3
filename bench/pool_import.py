"""Benchmark 7: peak RSS and rows/s of `ggpo pool import --from generic` on a synthetic JSON-lines file of 1M
responses, against the same import of a tenth of it (memory bounded: nearly flat in the row count).

Baseline (same run, same file): loading the file's records into memory with ``json.loads``. Each
measurement runs in its own process so that its peak RSS is its own.
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

M = 8


def write_rollouts(path: Path, responses: int, seed: int = 0) -> None:
    """Generic records with token ids only (the embedded model's vocabulary, no EOS), 16–96 response
    tokens, log-probs and 0/1 rewards; groups of 8 with an integer group key."""
    import numpy as np

    from ggpo_offline.core.model_io import load_tokenizer, tiny_model_dir

    tokenizer = load_tokenizer(tiny_model_dir())
    usable = np.array([i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids])
    rng = np.random.default_rng(seed)
    with path.open("w") as handle:
        for row in range(responses):
            group = row // M
            length = int(rng.integers(16, 97))
            record = {
                "prompt_token_ids": [int(t) for t in usable[(np.arange(12) + group) % len(usable)]],
                "response_token_ids": rng.choice(usable, length).tolist(),
                "behavior_logprobs": (-rng.random(length) * 3).round(6).tolist(),
                "reward": float(rng.random() < 0.5),
                "group": group,
                "finish_reason": "length",
            }
            handle.write(json.dumps(record) + "\n")


class PeakAnonymous:
    """The peak of the process's anonymous memory (RssAnon: heap, not file pages), sampled every 20 ms.
    The import reads its staging file memory-mapped: those pages count in the peak RSS but are page cache,
    which the kernel drops under pressure; RssAnon is what the import itself holds."""

    def __enter__(self) -> "PeakAnonymous":
        self.peak_kb, self._done = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._thread.join()


def measure(task: str, source: Path) -> dict:
    with PeakAnonymous() as anonymous:
        result = _measure(task, source)
    return result | {"peak_anon_mb": anonymous.peak_kb / 1024}


def _measure(task: str, source: Path) -> dict:
    start = time.perf_counter()
    if task == "json.loads":
        with source.open() as handle:
            rows = len([json.loads(line) for line in handle])
    else:
        from ggpo_offline.core.model_io import tiny_model_dir
        from ggpo_offline.importing.config import ImportConfig
        from ggpo_offline.importing.importer import import_pool

        out = source.with_suffix(".parquet")
        config = ImportConfig(
            format="generic", model=str(tiny_model_dir()), out=out, reward_from="file", check_samples=0
        )
        rows = import_pool(config, [source]).responses
    seconds = time.perf_counter() - start
    return {"task": task, "rows": rows, "seconds": seconds,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip


def _run(task: str, source: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", task, str(source)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--responses", type=int, default=1_000_000)
    parser.add_argument("--one", nargs=2, metavar=("TASK", "SOURCE"), help=argparse.SUPPRESS)
    parser.add_argument("--write", nargs=2, metavar=("RESPONSES", "SOURCE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], Path(args.one[1]))))
        return
    if args.write:
        write_rollouts(Path(args.write[1]), int(args.write[0]))
        return
    with tempfile.TemporaryDirectory() as folder:
        big, small = Path(folder) / "big.jsonl", Path(folder) / "small.jsonl"
        # Written in child processes: Linux keeps a process's peak RSS across exec, so every measuring child
        # must come from this small parent.
        for path, responses in ((big, args.responses), (small, args.responses // 10)):
            subprocess.run([sys.executable, __file__, "--write", str(responses), str(path)], check=True)
        size_mb = big.stat().st_size / 2**20
        results = [_run("json.loads", big), _run("import", small), _run("import", big)]
    base = results[0]
    print(f"synthetic generic JSON lines: {args.responses:,} responses (groups of {M}), {size_mb:,.0f} MB\n")
    print(
        "| task | rows | seconds | rows/s | peak RSS (MB) | peak anonymous (MB) | anonymous vs json.loads |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['task']} | {r['rows']:,} | {r['seconds']:.1f} | {r['rows'] / r['seconds']:,.0f} | "
            f"{r['peak_rss_mb']:,.0f} | {r['peak_anon_mb']:,.0f} | "
            f"{r['peak_anon_mb'] / base['peak_anon_mb']:.2f}x |"
        )
    print(
        "\nPeak RSS counts the staging file's memory-mapped pages (page cache the kernel reclaims); the "
        "anonymous peak is what the import holds itself."
    )


if __name__ == "__main__":
    main()
