"""Benchmark 8: where one training run's wall time goes, by phase (the run's own profile.jsonl), for the
`tiny` and `arc` presets on one core, as `make demo` and `make arc` run them.

Each run is a fresh `ggpo train` process, so its "process" phase is the start-up a compare pays once (its
later runs share the process, the engine and the π0 cache). `--after FLAGS` trains each preset a second
time with those flags added (e.g. the demo's `--eval-n 2`) and prints the cost of both as a ratio measured
in the same invocation; `--flags FLAGS` go to every run (`--flags "--eval-n 2 --eval-num-problems 64
--test-num-problems 64" --after "--sync-every 1"`: what a run sampling every update costs against its
offline twin, both at the demo's evaluation). `--run DIR` prints the profile of a run already trained instead.
"""

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ggpo_offline.train.profile import PHASES, TRAINING_PHASES, phase_totals
from ggpo_offline.train.run_folder import RunFolder

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


def seed_seconds(run_dir: Path) -> float:
    """What one more seed of this run costs in a compare: its training, its own validation evaluations
    (after update 0) and its test evaluations. The process start, π0 and the base model's validation are paid
    once per compare; the base model's test is in the run's "test" phase and counted here, a slight
    overcount in both runs of a ratio."""
    times = RunFolder(run_dir).read_profile()
    own = [t for t in times if t.phase in (*TRAINING_PHASES, "test") or (t.phase == "evaluate" and t.update)]
    return sum(t.seconds for t in own)


def train_and_profile(pool: Path, preset: str, method: str, extra: list[str], run_dir: Path) -> float:
    """Train one run in a fresh process; its wall seconds."""
    command = [
        GGPO, "train", "--pool", str(pool), "--preset", preset, "--method", method,
        "--seed", "42", "--threads", "1", "--no-tracking", *extra, "--out", str(run_dir),
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=run_dir.parent)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", type=Path, help="the pool [default: generate the demo's, ~2 min]")
    parser.add_argument("--presets", default="tiny,arc", help="comma-separated presets to profile")
    parser.add_argument("--method", default="ggpo")
    parser.add_argument("--after", help="flags of a second run per preset ('--eval-n 2'): prints the ratio")
    parser.add_argument("--flags", default="", help="flags of every run (the demo's evaluation, say)")
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
            common = shlex.split(args.flags)
            variants = {"": common}
            if args.after is not None:
                variants[args.after] = [*common, *shlex.split(args.after)]
            walls, seeds = {}, {}
            for flags, extra in variants.items():
                run_dir = Path(folder) / f"{preset}{len(walls)}"
                walls[flags] = train_and_profile(pool, preset, args.method, extra, run_dir)
                seeds[flags] = seed_seconds(run_dir)
                added = "".join(f", `{f}`" for f in (args.flags, flags) if f)
                print(f"### `{preset}`{added}: one {args.method} run, seed 42, one torch thread\n")
                print(profile_table(run_dir, walls[flags]))
                print(f"\n{evaluation_lines(run_dir)}\n")
            if args.after is not None:
                before, after = walls[""], walls[args.after]
                print(
                    f"**`{preset}` with `{args.after}` / without, same invocation:** one run in a fresh "
                    f"process {after:.0f} / {before:.0f} s = **{after / before:.2f}x**; one more seed in a "
                    f"compare (training, its own evaluations, test) {seeds[args.after]:.0f} / "
                    f"{seeds['']:.0f} s = **{seeds[args.after] / seeds['']:.2f}x**.\n"
                )


if __name__ == "__main__":
    main()
