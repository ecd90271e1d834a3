"""The local launcher: a command's jobs on this machine, ``--jobs N`` at a time, each worker pinned to its
share of the cores (and GPUs) and keeping its imports and engine from one job to the next."""

import contextlib
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ggpo_offline.core.errors import UserError, how_it_ended, one_line
from ggpo_offline.core.lifetime import quiet_resource_tracker
from ggpo_offline.jobs.job import Job, JobFailed, JobState, OnState, Session, shell_command

POLL_S = 1.0
"""How often a worker that died without a word is looked for while no news comes."""
STOP_S = 30.0
"""How long a stopped worker may take to end before it is killed."""


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (none without a GPU), found without
    importing torch: the variable itself, else nvidia-smi's list."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [gpu for gpu in given.split(",") if gpu.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return [str(i) for i, line in enumerate(listed.stdout.splitlines()) if line.startswith("GPU ")]


def shares(items: list, parts: int, each: int | None = None) -> list[list]:
    """``items`` cut into ``parts`` contiguous shares: ``each`` items apiece, else as even as they go."""
    if each is not None:
        return [items[i * each : (i + 1) * each] for i in range(parts)]
    base, extra = divmod(len(items), parts)
    cut, out = 0, []
    for i in range(parts):
        size = base + (i < extra)
        out.append(items[cut : cut + size])
        cut += size
    return out


LANE_OMP = {"OMP_WAIT_POLICY": "PASSIVE"}
"""What a worker sharing the machine with another sets for OpenMP (`worker_environments`)."""


def worker_environments(workers: int, nproc: int, cores: list[int], gpus: list[str]) -> list[dict[str, str]]:
    """Each worker's pinning: its share of the cores for vLLM's CPU threads and, on a GPU machine, ``nproc``
    GPUs of its own. Refused when the machine has too few of either.

    vLLM's CPU engine binds its threads only in its multiprocess executor; the engine a run starts in a
    process of its own keeps libgomp's team of every core. So the workers' OpenMP threads sleep at a barrier
    instead of spinning (`LANE_OMP`): two engines sampling at once on two cores otherwise spin against each
    other, ~3.5x slower (a round of 72 prompts of `make ladder`: 54-80 s against 16-20 s, 2026-12-07). Runs
    that sample no rounds pay for it a little (one A/B of four demo runs: 159 s against 148 s). The numbers
    stay the same, bit for bit (that A/B's counts.json and diagnostics.csv): the wait policy changes when a
    thread runs, not what it computes."""
    if workers == 1:
        return [{}]
    if len(cores) < workers:
        raise UserError(f"--jobs {workers} needs {workers} cores; this process may use {len(cores)}")
    if gpus and workers * nproc > len(gpus):
        raise UserError(
            f"--jobs {workers} x --nproc {nproc} needs {workers * nproc} GPUs; this machine shows {len(gpus)}"
        )
    environments = []
    for index, share in enumerate(shares(cores, workers)):
        environment = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, share)), **LANE_OMP}
        if gpus:
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(shares(gpus, workers, nproc)[index])
        environments.append(environment)
    return environments


class LocalLauncher:
    """Runs jobs here: in this process with one worker, else in ``workers`` processes that each take the
    next job when done with one. A job's output goes to its log file (``logs``/<job>.log) when it runs in a
    worker process."""

    name = "local"

    def __init__(self, workers: int, nproc: int, logs: Path, here: Session | None = None):
        """``here``: what jobs run in this process share (an engine the caller lends, a pool it read)."""
        self.workers, self.nproc, self.logs = workers, nproc, Path(logs)
        self.here = here if here is not None else Session()
        cores = sorted(os.sched_getaffinity(0))
        self._environments = worker_environments(workers, nproc, cores, visible_gpus())

    def describe(self) -> list[str]:
        """The plan's words: where the jobs run and on what."""
        if self.workers == 1:
            return ["launcher: local, one job at a time in this process"]
        pins = " | ".join(_pins(environment) for environment in self._environments)
        return [f"launcher: local, {self.workers} jobs at a time ({pins}); logs in {self.logs}"]

    def log_file(self, job_name: str) -> Path | None:
        return None if self.workers == 1 else self.logs / f"{job_name}.log"

    def run(self, jobs: list[Job], report: OnState) -> bool:
        """Run every job; True once all are done. The first that fails stops the others (each resumes
        where it stopped when run again) and raises `JobFailed`."""
        for job in jobs:
            report(job.name, JobState("queued"))
        if self.workers == 1:
            _run_here(jobs, report, self.here)
        else:
            self._run_in_workers(jobs, report)
        return True

    def _run_in_workers(self, jobs: list[Job], report: OnState) -> None:
        quiet_resource_tracker()
        context = multiprocessing.get_context("spawn")
        todo, news = context.Queue(), context.Queue()
        for job in jobs:
            todo.put(job)
        workers = []
        for index, environment in enumerate(self._environments):
            todo.put(None)  # one end mark a worker
            worker = context.Process(
                target=_serve, args=(index, environment, todo, news, str(self.logs)), name=f"ggpo-job-{index}"
            )
            worker.start()
            workers.append(worker)
        try:
            _follow(workers, news, {job.name for job in jobs}, report, self.log_file)
        except BaseException:
            _stop(workers, at_once=True)
            raise
        _stop(workers, at_once=False)


def _pins(environment: dict[str, str]) -> str:
    gpus = environment.get("CUDA_VISIBLE_DEVICES")
    cores = f"cores {environment['VLLM_CPU_OMP_THREADS_BIND']}"
    return f"{cores}, GPUs {gpus}" if gpus else cores


def _run_here(jobs: list[Job], report: OnState, session: Session) -> None:
    try:
        for job in jobs:
            report(job.name, JobState("running"))
            try:
                job.run(session, report)
            except UserError as failure:
                raise JobFailed(job.name, one_line(failure), None) from failure
            report(job.name, JobState("done"))
    finally:
        session.close()


def _follow(workers, news, pending: set[str], report: OnState, log_file) -> None:
    """Pass each worker's news on until every job has ended; a job that fails, or whose worker dies, raises
    `JobFailed`."""
    holding: dict[int, str] = {}
    while pending:
        try:
            index, name, state = news.get(timeout=POLL_S)
        except queue.Empty:
            for index, worker in enumerate(workers):
                if index in holding and not worker.is_alive():
                    why = f"its worker process {how_it_ended(worker.exitcode)}"
                    raise JobFailed(holding[index], why, log_file(holding[index])) from None
            continue
        report(name, state)
        if state.status == "running":
            holding[index] = name
        elif state.ended:
            holding.pop(index, None)
            pending.discard(name)
            if state.status == "failed":
                raise JobFailed(name, state.detail, log_file(name))


def _stop(workers, at_once: bool) -> None:
    """End the workers: once every job is done they exit by themselves (closing their engines); ``at_once``,
    each is stopped (SIGTERM) first. One that takes longer than STOP_S is killed."""
    if at_once:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
                with contextlib.suppress(OSError):  # a stopped process (SIGSTOP) acts on it once continued
                    os.kill(worker.pid, signal.SIGCONT)
    for worker in workers:
        worker.join(timeout=STOP_S)
        if worker.is_alive():
            worker.kill()
            worker.join()


def _serve(index: int, environment: dict, todo, news, logs: str) -> None:
    """A worker process: pinned by ``environment``, it runs jobs from ``todo`` until an end mark, each with
    its output in its log file, and tells ``news`` of every change."""
    from ggpo_offline.core.lifetime import exit_with_parent

    os.environ.update(environment)
    exit_with_parent()  # the compare killed: no orphan trains on
    session = Session()
    try:
        while (job := todo.get()) is not None:
            news.put((index, job.name, JobState("running")))

            def tell(name: str, state: JobState) -> None:
                print(f"{name}: {state.text()}", flush=True)  # into the log, beside what the job prints
                news.put((index, name, state))

            with _output_to(Path(logs) / f"{job.name}.log"):
                print(f"$ {shell_command(job)}", flush=True)
                state = _attempt(job, session, tell)
                print(f"{job.name}: {state.text()}", flush=True)
            news.put((index, job.name, state))
    finally:
        session.close()


def _attempt(job: Job, session: Session, report: OnState) -> JobState:
    try:
        job.run(session, report)
    except UserError as failure:
        print(f"error: {one_line(failure)}", file=sys.stderr)
        return JobState("failed", one_line(failure))
    except Exception as failure:  # a bug: its traceback in the log, one line to the compare
        traceback.print_exc()
        return JobState("failed", f"{type(failure).__name__}: {one_line(failure)}")
    return JobState("done")


@contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (its children's too) appended to ``log`` for the block."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a") as handle:
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
