"""Benchmark 8: where one training run's wall time goes, by phase (the run's own profile.jsonl), for the
`tiny` and `arc` presets on one core, as `make demo` and `make arc` run them.

Each run is a fresh `ggpo train` process, so its "process" phase is the start-up a compare pays once (its
later runs share the process, the engine and the π0 cache). `--run DIR` prints the profile of a run
already trained instead.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ggpo_offline.train.profile import PHASES, phase_totals
from ggpo_offline.train.run import RunFolder

GGPO = str(Path(sys.executable).parent / "ggpo")


def profile_table(run_dir: Path, wall_s: float | None = None) -> str:
    """Markdown: each phase's count, seconds and share of the run's recorded time."""
    totals = phase_totals(RunFolder(run_dir).read_profile())
    recorded = sum(seconds for _, seconds in totals.values())
    lines = ["| phase | times | seconds | share | what it covers |", "|---|---:|---:|---:|---|"]
    for name, (times, seconds) in totals.items():
        lines.append(f"| {name} | {times} | {seconds:.1f} | {seconds / recorded:.0%} | {PHASES[name]} |")
    lines.append(f"| recorded | | {recorded:.1f} | 100% | |")
    if wall_s is not None:
        lines.append(f"| command wall time | | {wall_s:.1f} | {wall_s / recorded:.0%} | |")
    return "\n".join(lines)


def evaluation_lines(run_dir: Path) -> str:
    """Each evaluation's seconds, and how many of them the engine spent sampling and scoring (its report)."""
    folder = RunFolder(run_dir)
    reports = {update: report.run["seconds"] for update, report in folder.read_evals().items()}
    rows = [
        f"update {record.update}: {record.seconds:.1f} s ({reports.get(record.update, float('nan')):.1f} s "
        "sampling and scoring)"
        for record in folder.read_profile()
        if record.phase == "evaluate"
    ]
    return "Validation evaluations: " + "; ".join(rows) + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", type=Path, help="the pool [default: generate the demo's, ~2 min]")
    parser.add_argument("--presets", default="tiny,arc", help="comma-separated presets to profile")
    parser.add_argument("--method", default="ggpo")
    parser.add_argument("--run", type=Path, help="print this finished run's profile, train nothing")
    args = parser.parse_args()
    if args.run is not None:
        print(profile_table(args.run))
        return
    with tempfile.TemporaryDirectory() as folder:
        pool = None if args.pool is None else args.pool.resolve()
        if pool is None:
            pool = Path(folder) / "base.parquet"
            subprocess.run([GGPO, "generate-pool", "--out", str(pool)], check=True, capture_output=True)
        for preset in args.presets.split(","):
            run_dir = Path(folder) / preset
            command = [
                GGPO, "train", "--pool", str(pool), "--preset", preset, "--method", args.method,
                "--seed", "42", "--threads", "1", "--no-tracking", "--out", str(run_dir),
            ]  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, cwd=folder)
            if done.returncode != 0:
                sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
            wall_s = time.perf_counter() - start
            print(f"### `{preset}`: one {args.method} run, seed 42, one torch thread\n")
            print(profile_table(run_dir, wall_s))
            print(f"\n{evaluation_lines(run_dir)}\n")


if __name__ == "__main__":
    main()
