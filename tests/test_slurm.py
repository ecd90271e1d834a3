"""`--launcher slurm` through a real one-node Slurm (tests/slurm_cluster.py): the local launcher's report,
a requeued task resumed equal, a cancelled one in one line, no controller refused before any write."""

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from ggpo_offline.core.errors import UserError
from ggpo_offline.generate.shard_jobs import shard_folder
from ggpo_offline.jobs.config import LaunchConfig, SlurmConfig
from ggpo_offline.jobs.slurm import JOBS_FILE, SlurmLauncher, SubmittedTasks
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.train.distributed import STOP_VARIABLE
from ggpo_offline.train.run_folder import CHECKPOINTS, STATE_FILE, RunFolder

GGPO = str(Path(sys.executable).parent / "ggpo")
REPORT_FILES = ("counts.json", "table.md", "table.csv", "diagnostics.csv")
# The smallest runs the hf pool holds (6 mixed groups: 3 updates x 2), a checkpoint after every update so that
# a task stopped at update 2 has one to resume from; evaluated by the hf engine (which starts in a second).
SETTINGS = ["--preset", "tiny", "--updates", "3", "--groups-per-batch", "2", "--save-every", "1"]
SETTINGS += ["--eval-every", "3", "--eval-n", "2", "--eval-k", "1,2", "--eval-num-problems", "4", "--no-test"]
SETTINGS += ["--eval-engine", "hf", "--no-tracking", "--threads", "1"]
STOP_POINTS = "0:training update 0,0:training update 2"
"""Where a run's task stops itself (SIGSTOP) in the test that follows, requeues and cancels it, whatever the
machine's load: before its first checkpoint, then after its checkpoint at update 2 and before it ends."""
POOL_FLAGS = ["--num-prompts", "2", "-m", "2", "--max-tokens", "16", "--engine", "hf", "--dtype", "float32"]
POOL_FLAGS += ["--reward-workers", "0"]


def compare_args(pool: Path, methods: str, seeds: str, out: Path) -> list[str]:
    runs = ["--pool", str(pool), "--methods", methods, "--seeds", seeds]
    return ["compare", *runs, *SETTINGS, "--out", str(out)]


def ggpo(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GGPO, *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def local_report(hf_pool, tmp_path_factory) -> Path:
    """The two runs' compare trained by the local launcher, as a user types it."""
    out = tmp_path_factory.mktemp("local") / "report"
    result = ggpo(*compare_args(hf_pool, "grpo,ggpo", "1", out))
    assert result.returncode == 0, result.stderr
    return out


def test_a_compare_through_slurm_follows_requeued_tasks_and_reports_what_the_local_launcher_reports(
    slurm_cluster, hf_pool, local_report, tmp_path
):
    """Submitted with --no-wait, both tasks stop themselves at update 0, before any checkpoint. The same
    command follows them, submitting nothing twice and leaving their folders to them; they go on to stop at
    update 2, where one is requeued and the other cancelled: the compare ends with the cancelled run's line,
    and the command it names follows the requeued task (resumed from its checkpoint) and submits the
    cancelled run again. The report and both runs equal the local launcher's, byte for byte."""
    out = tmp_path / "slurm"
    args = [*compare_args(hf_pool, "grpo,ggpo", "1", out), "--launcher", "slurm"]
    submitted = ggpo(*args, "--no-wait", env=slurm_cluster.env(**{STOP_VARIABLE: STOP_POINTS}))
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted 2 job(s)" in submitted.stdout
    tasks = SubmittedTasks.read(out / "slurm").tasks
    assert sorted(tasks) == ["ggpo-s1", "grpo-s1"]
    assert len({task.task_id.split("_")[0] for task in tasks.values()}) == 1  # one array
    runs = {name: out / "runs" / name for name in tasks}
    stopped = {
        name: slurm_cluster.wait_for(f"{name} to stop at update 0", lambda run=run: _stopped_run(run))
        for name, run in runs.items()
    }
    assert [path for run in runs.values() for path in run.glob(f"{CHECKPOINTS}/*/{STATE_FILE}")] == []
    requeued, cancelled = tasks["grpo-s1"], tasks["ggpo-s1"]

    log = tmp_path / "follow.log"
    with started(args, slurm_cluster.env(), stderr=log) as following:
        slurm_cluster.wait_for(  # past its plan, which leaves the runs' folders to their tasks: following
            "the compare to follow the tasks",
            lambda: following.poll() is not None or ": queued" in log.read_text(),
        )
        assert following.poll() is None, log.read_text()
        assert SubmittedTasks.read(out / "slurm").tasks == tasks  # nothing submitted twice
        for name, process in stopped.items():
            process.send_signal(signal.SIGCONT)
            checkpoint = RunFolder(runs[name]).checkpoint(2) / STATE_FILE
            slurm_cluster.wait_for(
                f"{name} to stop at update 2",
                lambda run=runs[name], state=checkpoint: state.is_file() and _stopped_run(run),
            )
        slurm_cluster.command("scontrol", "requeue", requeued.task_id)
        slurm_cluster.wait_for(
            "the requeued task to wait again",
            lambda: (
                slurm_cluster.queued().get(requeued.task_id) == "PENDING"
                and not stopped["grpo-s1"].is_running()
            ),
        )
        slurm_cluster.command("scancel", cancelled.task_id)
        following.wait(timeout=600)
    stderr = log.read_text()
    assert following.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    head = (
        f"error: run ggpo-s1 failed: Slurm task {cancelled.task_id} was cancelled (CANCELLED); its log: "
        f"{cancelled.log}; the same command continues: "
    )
    assert len(lines) == 1 and lines[0].startswith(head), stderr
    continuing = shlex.split(lines[0].removeprefix(head))
    assert continuing[:2] == ["ggpo", "compare"] and "--launcher" in continuing

    with started(continuing[1:], slurm_cluster.env()) as again:
        slurm_cluster.command("scontrol", "update", f"JobId={requeued.task_id}", "StartTime=now")
        # The requeued task keeps the environment it was submitted with: it stops at update 2 again.
        slurm_cluster.wait_for(
            "the requeued task to stop at update 2 again",
            lambda: _stopped_run(runs["grpo-s1"], other_than=stopped["grpo-s1"].pid),
        ).send_signal(signal.SIGCONT)
        _, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr
    assert {f"{name}: done" for name in tasks} <= set(stderr.splitlines())
    after = SubmittedTasks.read(out / "slurm").tasks
    assert after["grpo-s1"] == requeued  # followed, not submitted again
    assert after["ggpo-s1"].task_id != cancelled.task_id  # ended unfinished: submitted again
    assert Path(requeued.log).read_text().count("Starting with JobEnvironment") == 2  # one log, appended to
    for name in REPORT_FILES:
        assert (out / name).read_bytes() == (local_report / name).read_bytes(), name
    for name, run in runs.items():
        local = local_report / "runs" / name
        assert (run / "metrics.jsonl").read_bytes() == (local / "metrics.jsonl").read_bytes(), name
        weights = Path("final") / "model.safetensors"
        assert (run / weights).read_bytes() == (local / weights).read_bytes(), name


@contextmanager
def started(args: list[str], env: dict, stderr: Path | None = None) -> Iterator[subprocess.Popen]:
    """A ggpo command running in the background for the block (its stderr piped, or into ``stderr``), killed
    if it outlives the block (a failed test)."""
    with open(stderr or os.devnull, "w") as log:
        error = log if stderr is not None else subprocess.PIPE
        process = subprocess.Popen([GGPO, *args], env=env, stdout=subprocess.PIPE, stderr=error, text=True)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()


def _stopped_run(run_dir: Path, other_than: int | None = None) -> psutil.Process | None:
    """The `ggpo train` of ``run_dir`` once it has stopped itself at its GGPO_STOP_AT point (None before)."""
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if "train" in cmdline and str(run_dir) in cmdline and process.pid != other_than:
            if process.info["status"] == psutil.STATUS_STOPPED:
                return process
    return None


def test_no_controller_an_unknown_partition_or_no_slurm_is_refused_in_one_line_before_any_write(
    slurm_cluster, hf_pool, tmp_path, monkeypatch
):
    dead = tmp_path / "dead.conf"  # the cluster's conf, its controller's port one nobody listens on
    lines = slurm_cluster.conf.read_text().splitlines()
    dead.write_text("\n".join(line for line in lines if not line.startswith("SlurmctldPort=")) + "\n")
    with open(dead, "a") as conf:
        conf.write("SlurmctldPort=9\n")
    out = tmp_path / "report"
    refused = ggpo(
        *compare_args(hf_pool, "grpo", "1", out),
        "--launcher",
        "slurm",
        env=slurm_cluster.env(SLURM_CONF=str(dead)),
    )
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"error: no Slurm controller answers (SLURM_CONF={dead}): scontrol ping: Slurmctld(primary) at "
        f"{slurm_cluster.node} is DOWN"
    ]
    assert not out.exists()
    pool = tmp_path / "pool.parquet"
    refused = ggpo(
        "generate-pool", *POOL_FLAGS, "--launcher", "slurm", "--num-shards", "2", "--out", str(pool),
        env=slurm_cluster.env(SLURM_CONF=str(dead)),
    )  # fmt: skip
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("error: no Slurm controller answers") and not shard_folder(pool).exists()

    def launcher(**slurm) -> SlurmLauncher:
        return SlurmLauncher(LaunchConfig("slurm", slurm=SlurmConfig(**slurm)), tmp_path / "jobs")

    with pytest.raises(UserError) as unknown:
        launcher(partition="gpu")
    assert str(unknown.value) == "unknown --partition 'gpu'; this cluster has debug"
    with pytest.raises(UserError) as too_big:
        launcher(cpus_per_task=1024)
    assert str(too_big.value) == (
        "Slurm refuses the tasks' resources (--partition=debug --cpus-per-task=1024): Requested node "
        "configuration is not available"
    )
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    with pytest.raises(UserError, match=r"^Slurm is not installed here: sbatch, squeue, sinfo, scontrol"):
        launcher()
    assert not (tmp_path / "jobs").exists()


def test_generate_pool_through_slurm_merges_the_shards_the_local_commands_write(slurm_cluster, tmp_path):
    out = tmp_path / "slurm.parquet"
    result = ggpo("generate-pool", *POOL_FLAGS, "--launcher", "slurm", "--num-shards", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert {"shard-0: done", "shard-1: done"} <= set(result.stderr.splitlines())
    assert not shard_folder(out).exists()  # merged, then removed

    # The same shards, each generated by the command a user would type, then merged (one process).
    shards, local = tmp_path / "shards", tmp_path / "local.parquet"
    script = "import sys; from ggpo_cli.main import main; flags = sys.argv[1:]\n"
    script += "for i in (0, 1): main(['generate-pool', *flags, '--shard-index', str(i), '--num-shards', '2',"
    script += f" '--out', '{shards}/shard-' + str(i) + '.parquet'])\n"
    script += f"main(['pool', 'merge', '{shards}', '--out', '{local}'])\n"
    done = subprocess.run(
        [sys.executable, "-c", script, *POOL_FLAGS], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr
    merged, made_here = pq.read_table(out), pq.read_table(local)
    assert merged.schema == made_here.schema and merged.num_rows == made_here.num_rows
    assert [c for c in merged.column_names if not merged[c].equals(made_here[c])] == []  # names what differs
    footers = [read_pool_info(path).raw for path in (out, local)]
    for footer in footers:
        footer.pop("created"), footer.pop("generation_seconds")
    assert footers[0] == footers[1]


def test_the_record_of_submitted_tasks_reads_back_and_an_unreadable_one_is_one_line(tmp_path):
    from ggpo_offline.jobs.slurm import SubmittedTask

    record = SubmittedTasks(
        {"grpo-s1": SubmittedTask("12_0", ("ggpo", "train", "--seed", "1"), "/x/12_0_0_log.out")}
    )
    record.write(tmp_path)
    assert SubmittedTasks.read(tmp_path) == record
    assert SubmittedTasks.read(tmp_path / "none") == SubmittedTasks({})
    (tmp_path / JOBS_FILE).write_text("{")
    with pytest.raises(UserError, match=rf"^{tmp_path / JOBS_FILE} is unreadable \(.*\); check with squeue"):
        SubmittedTasks.read(tmp_path)
