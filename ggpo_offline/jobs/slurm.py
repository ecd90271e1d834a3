"""The Slurm launcher: a command's jobs as one job array submitted through submitit, each task requeueable,
followed through squeue and the files the jobs write (no accounting database needed)."""

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from filelock import FileLock, Timeout

from ggpo_offline.core.errors import UserError, how_it_ended, one_line, write_json, writing
from ggpo_offline.jobs.config import LaunchConfig
from ggpo_offline.jobs.job import Job, JobFailed, JobState, OnState

POLL_S = 3.0
"""How often squeue is asked while jobs are followed (the states are told only when they change)."""
OUTAGE_S = 600.0
"""How long the controller may stay silent while jobs are followed (a restart, a failover) before the
command gives up, saying that the same command follows the jobs again."""
FILES_S = 120.0
"""How long a task that ended well may take to show its job's files here (a network filesystem's caches)."""
CLIENT_S = 60.0
"""Time limit of one Slurm client command (sinfo, squeue, sbatch)."""
JOBS_FILE = "jobs.json"
FOLLOWER_LOCK = ".follower.lock"
"""Held by the one command that submits and follows a folder's jobs: two would submit them twice."""
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "srun")
ENDED = {
    "BOOT_FAIL": "its node failed to boot (BOOT_FAIL)",
    "CANCELLED": "was cancelled (CANCELLED)",
    "COMPLETED": "ended (COMPLETED) with its work not done",
    "DEADLINE": "passed its deadline (DEADLINE)",
    "FAILED": "failed (FAILED)",
    "NODE_FAIL": "lost its node (NODE_FAIL)",
    "OUT_OF_MEMORY": "ran out of memory (OUT_OF_MEMORY)",
    "PREEMPTED": "was preempted without requeue (PREEMPTED)",
    "REVOKED": "was revoked (REVOKED)",
    "TIMEOUT": "reached its time limit (TIMEOUT); raise --time-min",
}
"""The states of a task that left for good, as its failure reads."""
RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING"}
"""States in which the task's command runs (or is being wound up); any other state not ended is queued."""
OWN_OPTIONS = {"output", "error", "array", "open-mode", "requeue", "job-name", "wrap", "parsable"}
"""sbatch options the launcher sets itself: --sbatch may not change where logs go or what is submitted."""


@dataclass(frozen=True)
class SubmittedTask:
    """One job as submitted: its Slurm task (``12_3``, or ``12`` for a lone job), the command it runs (as
    typed), and its output file."""

    task_id: str
    command: tuple[str, ...]
    log: str


@dataclass(frozen=True)
class SubmittedTasks:
    """jobs.json in the launcher's folder: every job submitted there, by job name, so that the same command
    again follows the tasks still queued or running instead of submitting them twice."""

    FORMAT: ClassVar[int] = 1
    tasks: dict[str, SubmittedTask]

    def to_dict(self) -> dict:
        tasks = {
            name: {"task_id": task.task_id, "command": list(task.command), "log": task.log}
            for name, task in self.tasks.items()
        }
        return {"format": self.FORMAT, "tasks": tasks}

    @classmethod
    def from_dict(cls, data: dict) -> "SubmittedTasks":
        tasks = {
            name: SubmittedTask(task["task_id"], tuple(task["command"]), task["log"])
            for name, task in data["tasks"].items()
        }
        return cls(tasks)

    def write(self, folder: Path) -> None:
        """Written whole or not at all: a command killed while writing leaves the previous record."""
        write_json(self.to_dict(), Path(folder) / JOBS_FILE)

    @classmethod
    def read(cls, folder: Path) -> "SubmittedTasks":
        """The record in ``folder``; empty when nothing was submitted there; UserError when unreadable."""
        path = Path(folder) / JOBS_FILE
        if not path.is_file():
            return cls({})
        try:
            data = json.loads(path.read_text())
            if data.get("format") != cls.FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {cls.FORMAT}")
            return cls.from_dict(data)
        except (ValueError, KeyError, TypeError, AttributeError) as problem:
            raise UserError(
                f"{path} is unreadable ({one_line(problem)}); check with squeue that none of its jobs still "
                "runs, then delete it"
            ) from None


class TaskCommand:
    """What a Slurm task runs: a job's command, its output going straight to the task's log. Pickled by
    submitit and called in the task; a command that fails raises, so that submitit records the failure."""

    def __init__(self, argv: list[str]):
        self.argv = argv

    def __call__(self) -> None:
        ended = subprocess.run(self.argv, check=False).returncode
        if ended != 0:
            # The command's own error line, when it wrote one, comes first in the log: the follower tells it.
            said = f"{Path(self.argv[0]).name} {self.argv[1]} {how_it_ended(ended)}"
            print(f"error: {said}", file=sys.stderr, flush=True)
            raise RuntimeError(said)


def task_argv(job: Job) -> list[str]:
    """The job's command with this environment's ggpo: a task may start where another ggpo comes first on
    PATH, or none."""
    first, *rest = job.argv()
    return [str(Path(sys.executable).parent / first) if first == "ggpo" else first, *rest]


class SlurmLauncher:
    """Runs jobs as the tasks of one Slurm job array, through submitit; ``folder`` holds the tasks' logs,
    submitit's files and jobs.json. Built checked: Slurm's commands on PATH, a controller that answers, the
    partition and every resource asked for (``sbatch --test-only``), before anything is written.

    ``nproc``: the processes of each job (``--nproc``, torchrun inside the task): a task gets at least one
    CPU for each, and refuses fewer GPUs than processes when it asks for GPUs at all."""

    name = "slurm"

    def __init__(self, launch: LaunchConfig, folder: Path, nproc: int = 1):
        self.launch, self.slurm, self.folder, self.nproc = launch, launch.slurm, Path(folder), nproc
        self.cpus = max(self.slurm.cpus_per_task, nproc)
        if 0 < self.slurm.gpus_per_task < nproc:
            raise UserError(
                f"--nproc {nproc} runs {nproc} processes a task, one a GPU: --gpus-per-task "
                f"{self.slurm.gpus_per_task} is too few"
            )
        reserved = sorted(OWN_OPTIONS & {key.replace("_", "-") for key in self.slurm.sbatch_options()})
        if reserved:
            raise UserError(f"--sbatch {reserved[0]}=... is set by ggpo itself (each task's log, the array)")
        self._check_clients()
        partitions, default = self._partitions()
        if self.slurm.partition is None and default is None:
            raise UserError(f"this Slurm cluster has no default partition; give --partition ({partitions})")
        if self.slurm.partition is not None and self.slurm.partition not in partitions.split(", "):
            raise UserError(f"unknown --partition {self.slurm.partition!r}; this cluster has {partitions}")
        self.partition = self.slurm.partition or default
        self._check_resources()

    # -- checks, before anything is written

    def _check_clients(self) -> None:
        missing = [name for name in CLIENTS if shutil.which(name) is None]
        if missing:
            raise UserError(
                f"Slurm is not installed here: {', '.join(missing)} not found on PATH (--launcher slurm "
                "submits from a machine of the cluster)"
            )
        conf = os.environ.get("SLURM_CONF")
        if conf is not None and not Path(conf).is_file():
            raise UserError(f"SLURM_CONF names {conf}, which is not a file")
        pinged = _client(["scontrol", "ping"])
        if pinged.returncode != 0 or "DOWN" in pinged.stdout:
            down = [line for line in pinged.stdout.splitlines() if "DOWN" in line]  # then a banner of stars
            said = one_line(down[0]) if down else _last_line(pinged.stderr) or how_it_ended(pinged.returncode)
            raise UserError(f"no Slurm controller answers ({_where_conf()}): scontrol ping: {said}")

    def _partitions(self) -> tuple[str, str | None]:
        """The cluster's partitions (as one comma-separated text) and its default one."""
        shown = _client(["sinfo", "--noheader", "--format=%P"])
        if shown.returncode != 0:
            said = _last_line(shown.stderr) or how_it_ended(shown.returncode)
            raise UserError(f"no Slurm controller answers ({_where_conf()}): sinfo: {said}")
        names = list(dict.fromkeys(shown.stdout.split()))
        default = next((name.rstrip("*") for name in names if name.endswith("*")), None)
        return ", ".join(name.rstrip("*") for name in names), default

    def _check_resources(self) -> None:
        """What the tasks ask for, checked by the controller itself without submitting."""
        asked = [f"--{key}" if value is True else f"--{key}={value}" for key, value in self.options().items()]
        tested = _client(["sbatch", "--test-only", f"--time={self.slurm.time_min}", *asked, "--wrap=true"])
        if tested.returncode != 0:
            said = _last_line(tested.stderr) or how_it_ended(tested.returncode)
            for prefix in ("sbatch: error: ", "allocation failure: ", "Batch job submission failed: "):
                said = said.removeprefix(prefix)
            raise UserError(f"Slurm refuses the tasks' resources ({' '.join(asked)}): {said}")

    def options(self) -> dict[str, str | bool]:
        """Each task's sbatch options but its time limit, by option name (True: a bare flag)."""
        slurm = self.slurm
        options: dict[str, str | bool] = {"partition": self.partition, "cpus-per-task": str(self.cpus)}
        if slurm.gpus_per_task:
            options["gpus-per-node"] = str(slurm.gpus_per_task)  # one task a job: its node's GPUs are its own
        if slurm.mem_gb is not None:
            options["mem"] = f"{math.ceil(slurm.mem_gb * 1024)}M"
        for key in ("account", "qos"):
            if getattr(slurm, key) is not None:
                options[key] = getattr(slurm, key)
        for key, value in slurm.sbatch_options().items():
            options[key.replace("_", "-")] = value if value else True
        return options

    # -- the Launcher protocol

    def describe(self) -> list[str]:
        slurm = self.slurm
        gpus = f", {slurm.gpus_per_task} GPU(s)" if slurm.gpus_per_task else ""
        memory = f"{slurm.mem_gb:g} GB" if slurm.mem_gb is not None else "the partition's default memory"
        raised = f" (--nproc {self.nproc}: one CPU a process)" if self.cpus > slurm.cpus_per_task else ""
        extra = [f"{key} {getattr(slurm, key)}" for key in ("account", "qos") if getattr(slurm, key)]
        extra += [f"sbatch {option}" for option in slurm.sbatch]
        return [
            f"launcher: slurm, one job array (a task per job) on partition {self.partition}",
            f"each task: {self.cpus} CPU(s){raised}{gpus}, {memory}, {slurm.time_min} min"
            + "".join(f", {words}" for words in extra)
            + "; submitted with --requeue (a requeued task carries its job on where it stopped)",
            f"logs: {self.folder}/<array id>_<task>_0_log.out; the tasks' ids in {self.folder / JOBS_FILE}",
        ]

    def log_file(self, job_name: str) -> Path | None:
        task = SubmittedTasks.read(self.folder).tasks.get(job_name)
        return Path(task.log) if task is not None else None

    def run(self, jobs: list[Job], report: OnState) -> bool:
        """Submit the jobs not already queued or running (those are followed) as one array, then follow
        them all until each is done; a task that ended with its job unfinished raises `JobFailed` (the
        others run on: the same command follows them). ``--no-wait``: False once submitted."""
        if not jobs:
            return True
        with writing(self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(self.folder / FOLLOWER_LOCK, timeout=0):
                return self._run(jobs, report)
        except Timeout:
            raise UserError(
                f"another command submits and follows the jobs of {self.folder}: let it end, then run this "
                "one again"
            ) from None

    def _run(self, jobs: list[Job], report: OnState) -> bool:
        record = SubmittedTasks.read(self.folder)
        queue = self._queue(record.tasks.values(), tolerate_silence=False)
        following, to_submit = {}, []
        for job in jobs:
            earlier = record.tasks.get(job.name)
            if earlier is not None and earlier.task_id in queue and queue[earlier.task_id][0] not in ENDED:
                if earlier.command != tuple(job.argv()):
                    raise UserError(
                        f"{job.name} is still queued or running as Slurm task {earlier.task_id} with another "
                        f"command ({shlex.join(earlier.command)}); let it end or scancel {earlier.task_id}"
                    )
                following[job.name] = earlier
            elif not job.finished():
                to_submit.append(job)
        submitted = self._submit(to_submit) if to_submit else {}
        if submitted:
            SubmittedTasks({**record.tasks, **submitted}).write(self.folder)
        tasks = {**following, **submitted}
        for job in jobs:
            report(job.name, JobState("queued") if job.name in tasks else JobState("done"))
        if self.launch.no_wait and tasks:
            return False
        self._follow([job for job in jobs if job.name in tasks], tasks, report)
        return True

    # -- submitting and following

    def _submit(self, jobs: list[Job]) -> dict[str, SubmittedTask]:
        import submitit

        executor = submitit.SlurmExecutor(folder=self.folder)
        executor.update_parameters(
            job_name="ggpo",
            time=self.slurm.time_min,
            stderr_to_stdout=True,  # one log a task, appended to across requeues (submitit's open-mode)
            additional_parameters={**self.options(), "requeue": True},
        )
        try:
            with executor.batch():
                handles = [executor.submit(TaskCommand(task_argv(job))) for job in jobs]
        except Exception as failure:  # sbatch's refusal, as submitit raises it
            said = _last_line(str(failure)) or one_line(failure)
            raise UserError(f"sbatch refused the jobs: {said}") from None
        return {
            job.name: SubmittedTask(handle.job_id, tuple(job.argv()), str(handle.paths.stdout))
            for job, handle in zip(jobs, handles, strict=True)
        }

    def _follow(self, jobs: list[Job], tasks: dict[str, SubmittedTask], report: OnState) -> None:
        told: dict[str, JobState] = {}
        ended_well_at: dict[str, float] = {}
        pending = list(jobs)
        while pending:
            queue = self._queue(tasks.values(), tolerate_silence=True)
            for job in list(pending):
                task = tasks[job.name]
                state = self._state(job, task, queue.get(task.task_id), ended_well_at)
                if state != told.get(job.name):
                    report(job.name, state)
                    told[job.name] = state
                if state.status == "done":
                    pending.remove(job)
                elif state.status == "failed":
                    raise JobFailed(job.name, state.detail, Path(task.log))
            if pending:
                time.sleep(POLL_S)

    def _state(
        self, job: Job, task: SubmittedTask, seen: tuple[str, str] | None, ended_well_at: dict[str, float]
    ) -> JobState:
        """A job's state from its task's place in the queue (``seen``: state and reason; None once it left)
        and its own files: done only once the task has left and the job's work is complete."""
        if seen is not None and seen[0] not in ENDED:
            if seen[0] in RUNNING:
                return JobState("running", _progress(job))
            return JobState("queued", f"({seen[1]})" if seen[1] not in ("None", "") else "")
        if job.finished():
            return JobState("done")
        if _result(task) == "success":  # its files are still on their way here
            first = ended_well_at.setdefault(job.name, time.monotonic())
            if time.monotonic() - first < FILES_S:
                return JobState("running", _progress(job))
        return JobState("failed", _why_failed(task, seen[0] if seen is not None else None))

    def _queue(self, tasks, tolerate_silence: bool) -> dict[str, tuple[str, str]]:
        """Each task of ``tasks``' arrays that Slurm still lists (ended ones for a few minutes), by task id:
        its state and reason. ``tolerate_silence``: a controller that does not answer is asked again for up
        to OUTAGE_S."""
        arrays = sorted({task.task_id.split("_")[0] for task in tasks})
        if not arrays:
            return {}
        command = ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T|%r"]
        command.append(f"--jobs={','.join(arrays)}")
        silent_since = time.monotonic()
        while True:
            listed = _client(command)
            if listed.returncode == 0:
                rows = [line.split("|") for line in listed.stdout.splitlines() if line.count("|") == 2]
                return {row[0]: (row[1], row[2]) for row in rows}
            if "Invalid job id" in listed.stderr:
                return {}  # every one of them ended long enough ago to be forgotten
            said = _last_line(listed.stderr) or how_it_ended(listed.returncode)
            if not tolerate_silence or time.monotonic() - silent_since > OUTAGE_S:
                raise UserError(
                    f"Slurm's controller does not answer ({_where_conf()}): squeue: {said}; the jobs run on "
                    "where they were submitted: the same command follows them again"
                )
            time.sleep(POLL_S)


def _progress(job: Job) -> str:
    """How far the job has come, or "" while what it reads is being written (a line half appended)."""
    try:
        return job.progress()
    except (OSError, ValueError):
        return ""


def _client(command: list[str]) -> subprocess.CompletedProcess:
    """A Slurm client command; one that hangs (an unreachable controller's retries) reads as failed."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=CLIENT_S, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 1, "", f"no answer within {CLIENT_S:.0f} s")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return one_line(lines[-1]) if lines else ""


def _where_conf() -> str:
    conf = os.environ.get("SLURM_CONF")
    return f"SLURM_CONF={conf}" if conf else "SLURM_CONF unset: /etc/slurm/slurm.conf or the DNS SRV record"


def _result(task: SubmittedTask) -> str | None:
    """What submitit recorded of the task's last attempt: ``success``, ``error``, or None (none: the task
    was killed or cancelled before it could say)."""
    from submitit.core.utils import JobPaths, pickle_load

    path = JobPaths(Path(task.log).parent, job_id=task.task_id).result_pickle
    if not path.is_file():
        return None
    try:
        return pickle_load(path)[0]
    except Exception:  # a file half written by a task being killed says nothing
        return None


def _why_failed(task: SubmittedTask, state: str | None) -> str:
    """One line on why a task ended without its job's work done: Slurm's state where it tells (cancelled,
    out of memory, time limit), else the first error line the job's command wrote in its last attempt."""
    if state in ENDED and state not in ("FAILED", "COMPLETED"):
        return f"Slurm task {task.task_id} {ENDED[state]}"
    said = _first_error(Path(task.log))
    if said is not None:
        return said
    if state is not None:
        return f"Slurm task {task.task_id} {ENDED[state]}"
    return f"Slurm task {task.task_id} left the queue with its work not done (cancelled or killed)"


def _first_error(log: Path) -> str | None:
    """The first ``error: ...`` line of the task's last attempt in its log (appended to at each start)."""
    if not log.is_file():
        return None
    attempts = log.read_text(errors="replace").split("Starting with JobEnvironment")
    for line in attempts[-1].splitlines():
        if line.startswith("error: "):
            return one_line(line.removeprefix("error: "))
    return None
