"""The chaos run (`make chaos`): short jobs, each hit at a random moment by a SIGKILL of a reward worker of
generate-pool, of the whole generate-pool, of a torchrun worker, of the evaluation engine or of the whole
training job, or by a SIGSTOP of a torchrun worker (it hangs). Each must complete, or stop with one `error:`
line (a killed job says nothing: it is gone);
then the command the line names (--resume, --overwrite; generate-pool resumes by itself) must give the
uninterrupted run's pool or metrics, bit for bit, and no process of the job may be left behind."""

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from ggpo_offline.train.run_folder import RunFolder

GGPO = str(Path(sys.executable).parent / "ggpo")
POOL = [
    "generate-pool", "--engine", "hf", "--dtype", "float32", "--num-prompts", "48", "-m", "4",
    "--max-tokens", "48", "--reward-workers", "2", "--batch-prompts", "6",
]  # fmt: skip
# 6 updates x 2 groups = 12 of the pool's 16 mixed-reward groups (the embedded model completes few answers
# within 48 tokens); `tests/test_make_targets.py` generates this pool and dry-runs this plan on it.
TRAIN = [
    "train", "--method", "ggpo", "--nproc", "2", "--updates", "6", "--groups-per-batch", "2",
    "--save-every", "2", "--eval-every", "2", "--eval-engine", "hf", "--eval-n", "2",
    "--eval-num-problems", "8", "--no-test", "--no-tracking", "--threads", "1",
    "--collective-timeout", "120", "--wait-timeout", "600",
]  # fmt: skip
KINDS = (
    "reward worker", "whole generate-pool", "torchrun worker", "evaluation engine", "whole training job",
    "stopped torchrun worker",
)  # fmt: skip
# A stopped (SIGSTOP) worker is noticed by the timeouts only: short ones for this run.
STOPPED_TIMEOUTS = ["--collective-timeout", "15", "--wait-timeout", "90"]
LEFTOVER_WAIT_S = 30
UNCLEAN = "unclean"  # an end with more (or less) than one error line, or a traceback


@dataclass
class Outcome:
    kind: str
    kill_at_s: float
    killed: str  # what was killed, or "nothing" when the job ended first
    exit: str  # "completed", "error line", "killed"
    recovery: str  # the command that completed it ("" when it completed by itself)
    equal: bool
    leftovers: int
    line: str = ""  # the job's error line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="ggpo-chaos-") as folder:
        work = Path(folder)
        reference_pool, pool_s = _timed(POOL + ["--out", str(work / "reference.parquet")])
        _timed(TRAIN + ["--pool", str(reference_pool), "--out", str(work / "reference"), "--dry-run"])
        reference_run, train_s = _timed(
            TRAIN + ["--pool", str(reference_pool), "--out", str(work / "reference")]
        )
        print(f"uninterrupted: generate-pool {pool_s:.0f} s, train --nproc 2 {train_s:.0f} s")
        outcomes = []
        for number in range(args.runs):
            kind = KINDS[number % len(KINDS)] if number < len(KINDS) else rng.choice(KINDS)
            span = pool_s if "generate" in kind or kind == "reward worker" else train_s
            outcome = _chaos_run(
                kind, rng.uniform(0.1, 0.9) * span, work / f"run-{number}", reference_pool, rng
            )
            outcomes.append(outcome)
            print(_row(number, outcome), flush=True)
            if outcome.line:
                print(f"    {outcome.line}", flush=True)
    return _summary(outcomes)


def _timed(arguments: list[str]) -> tuple[Path, float]:
    start = time.monotonic()
    done = subprocess.run([GGPO, *arguments], capture_output=True, text=True)
    if done.returncode != 0:  # a plan larger than the pool stops at the dry run, before any kill
        sys.exit(f"the uninterrupted run failed: {done.stderr[-2000:]}")
    return Path(arguments[arguments.index("--out") + 1]), time.monotonic() - start


def _chaos_run(kind: str, kill_at_s: float, out: Path, reference_pool: Path, rng: random.Random) -> Outcome:
    pooling = kind in ("reward worker", "whole generate-pool")
    command = (
        POOL + ["--out", str(out.with_suffix(".parquet"))]
        if pooling
        else TRAIN + ["--pool", str(reference_pool), "--out", str(out)]
    )
    # The short timeouts only notice the stop: the recovery, with nothing stopped, runs on the plan's own,
    # so that a loaded machine's slow evaluation is not taken for a hang (make chaos seed 2, run 9).
    stopped = STOPPED_TIMEOUTS if kind == "stopped torchrun worker" else []
    job = subprocess.Popen(
        [GGPO, *command, *stopped], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )  # the last of a flag given twice wins
    tree = psutil.Process(job.pid)
    time.sleep(kill_at_s)
    victim = _victim(kind, tree, rng)
    while victim is None and job.poll() is None:  # the target is not up yet (or between two of its lives)
        time.sleep(0.2)
        victim = _victim(kind, tree, rng)
    processes = _family(tree)
    if victim is not None:
        victim.send_signal(signal.SIGSTOP if kind.startswith("stopped") else signal.SIGKILL)
    stderr = job.communicate()[1]
    leftovers = _leftovers(processes)
    exit_kind, recovery = "completed", ""
    if job.returncode != 0:
        exit_kind, recovery = _recover(job.returncode, stderr, command, None if pooling else out)
    line = next((line for line in stderr.splitlines() if line.startswith("error:")), "")
    if recovery.startswith("failed"):
        equal = False
    else:
        equal = _same_pool(out.with_suffix(".parquet"), reference_pool) if pooling else _same_run(out)
    killed = "nothing" if victim is None else kind
    return Outcome(kind, kill_at_s, killed, exit_kind, recovery, equal, leftovers, line)


def _victim(kind: str, job: psutil.Process, rng: random.Random) -> psutil.Process | None:
    """The process to kill, None when the job has ended (or the target does not exist at this moment)."""
    try:
        children = [p for p in job.children() if "spawn_main" in " ".join(p.cmdline())]
        if kind in ("whole generate-pool", "whole training job"):
            return job if job.is_running() and job.status() != psutil.STATUS_ZOMBIE else None
        if kind in ("reward worker", "torchrun worker", "stopped torchrun worker"):
            return rng.choice(children) if children else None
        engines = [p for w in children for p in w.children() if "spawn_main" in " ".join(p.cmdline())]
        return engines[0] if engines else None
    except psutil.NoSuchProcess:
        return None


def _family(job: psutil.Process) -> list[psutil.Process]:
    try:
        return [job, *job.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _leftovers(processes: list[psutil.Process]) -> int:
    """Processes of the job still alive ``LEFTOVER_WAIT_S`` after it ended (orphans)."""
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while time.monotonic() < deadline:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return 0
        time.sleep(0.5)
    for process in alive:
        process.kill()
    return len(alive)


def _recover(returncode: int, stderr: str, command: list[str], run: Path | None) -> tuple[str, str]:
    """Check how the job ended and run the command that continues it (``run``: the training run's
    folder, None for generate-pool); returns (exit, recovery)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    if returncode == -signal.SIGKILL:  # the whole job was killed: it could not say anything
        exit_kind = "killed"
        assert not errors, errors
        extra = [] if run is None else ["--resume"] if RunFolder(run).latest_checkpoint() else ["--overwrite"]
    else:
        exit_kind = "error line"
        if not (returncode == 1 and len(errors) == 1 and "Traceback" not in stderr):
            exit_kind = UNCLEAN  # counted as a failed run; its output says why
            print(stderr[-3000:], file=sys.stderr)
        extra = [flag for flag in ("--resume", "--overwrite") if errors and flag in errors[0]][:1]
    done = subprocess.run([GGPO, *command, *extra], capture_output=True, text=True)
    if done.returncode != 0:  # counted as a failed run, and the next run goes on
        print(done.stderr[-3000:], file=sys.stderr)
        return UNCLEAN, " ".join(["failed:", *extra])
    return exit_kind, " ".join(["rerun", *extra])


def _same_pool(pool: Path, reference: Path) -> bool:
    """Token ids, log-probs, rewards, grouping: every column equal (the metadata holds timings)."""
    table, expected = pq.read_table(pool), pq.read_table(reference)
    return table.replace_schema_metadata(None).equals(expected.replace_schema_metadata(None))


def _same_run(run: Path) -> bool:
    """metrics.jsonl, the evaluation counts and the final weights equal the uninterrupted run's."""
    reference = run.parent / "reference"
    same = (run / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()
    for report in sorted((reference / "eval").glob("*.json")):
        counts = json.loads(report.read_text())["benchmarks"]
        same &= json.loads((run / "eval" / report.name).read_text())["benchmarks"] == counts
    weights = "final/model.safetensors"
    return same and (run / weights).read_bytes() == (reference / weights).read_bytes()


def _row(number: int, o: Outcome) -> str:
    return (
        f"run {number}: {o.kind:20s} kill at {o.kill_at_s:5.1f} s -> killed {o.killed:20s} "
        f"ended: {o.exit:10s} recovery: {o.recovery or '-':16s} equal: {o.equal} leftovers: {o.leftovers}"
    )


def _summary(outcomes: list[Outcome]) -> int:
    kills = sum(o.killed != "nothing" for o in outcomes)
    ends = Counter(o.exit for o in outcomes)
    recovered = sum(bool(o.recovery) for o in outcomes)
    bad = [o for o in outcomes if not o.equal or o.leftovers or o.exit == UNCLEAN]
    print(
        f"chaos: {len(outcomes)} runs, {kills} kills; ended {dict(ends)}; {recovered} recovered by the "
        f"command they named; {len(bad)} runs ending unclean, unlike the uninterrupted one or leaving "
        "processes behind"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
