"""A job — one unit of a command's work that any launcher runs — and what is known of it while it runs."""

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

Status = Literal["queued", "running", "done", "failed"]


@dataclass(frozen=True)
class JobState:
    """Where a job is: queued, running (``detail``: how far, e.g. ``update 12/20``), done, or failed
    (``detail``: why, in one line)."""

    status: Status
    detail: str = ""

    @property
    def ended(self) -> bool:
        return self.status in ("done", "failed")

    def text(self) -> str:
        return f"{self.status} {self.detail}".strip() if self.status != "failed" else f"failed: {self.detail}"


OnState = Callable[[str, JobState], None]
"""Told of each job's new state, by job name."""


class Job(Protocol):
    """One unit of work: a command a launcher can run anywhere (``argv``), or run in a worker process that
    keeps what an earlier job started (``run``). Running it again carries it on: a job that was stopped or
    requeued resumes, one that finished is left as it is."""

    @property
    def name(self) -> str: ...

    def argv(self) -> list[str]:
        """The command, as typed (first word ``ggpo``)."""
        ...

    def run(self, session: "Session", report: OnState) -> None:
        """Do the job in this process; a problem is raised as one `UserError` line."""
        ...

    def progress(self) -> str:
        """How far the job has come, from what it has written (``update 12/20``; "" when unknown)."""
        ...

    def finished(self) -> bool:
        """Whether what the job writes is complete."""
        ...


class Session:
    """What a worker keeps between its jobs (a started engine, a pool it read), each under a key, closed
    when the worker ends."""

    def __init__(self, engine=None):
        from contextlib import ExitStack

        self.engine = engine
        """An engine lent by the caller (tests share one); else each job kind starts its own, once."""
        self._stack = ExitStack()
        self._kept: dict = {}

    def lend(self, key, value) -> None:
        """Give the jobs what the caller already has under ``key`` (compare's checked pool)."""
        self._kept[key] = value

    def keep(self, key, make: Callable):
        """What ``make(stack)`` made for ``key``, made once; ``stack`` (an ExitStack) closes it at the end."""
        if key not in self._kept:
            self._kept[key] = make(self._stack)
        return self._kept[key]

    def close(self) -> None:
        self._stack.close()


def shell_command(job: Job) -> str:
    return shlex.join(job.argv())


class Launcher(Protocol):
    """Runs a command's jobs somewhere (`local`, `slurm`); built checked, so that a launcher that cannot
    run them (too few cores, no controller, an unknown partition) refuses before anything is written."""

    def describe(self) -> list[str]:
        """Where the jobs will run and on what, for --dry-run."""
        ...

    def log_file(self, job_name: str) -> Path | None:
        """Where a job's output goes (None: this terminal)."""
        ...

    def run(self, jobs: list[Job], report: OnState) -> bool:
        """Run (or submit) every job, telling ``report`` of each state; True once all are done, False when
        the launcher returned after submitting (``--no-wait``). A failed job raises `JobFailed`."""
        ...


class JobFailed(Exception):
    """A job ended without its work done: ``name``, why (one line), its log file."""

    def __init__(self, name: str, why: str, log: Path | None):
        super().__init__(f"{name} failed: {why}")
        self.name, self.why, self.log = name, why, log
