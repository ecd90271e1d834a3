"""`ggpo train --nproc N`: N training processes on this machine, started by torch's elastic launcher
(what `torchrun --standalone` runs), with a worker's failure brought back as one line."""

import json
import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path

from ggpo_offline.core.errors import JobFailure, UserError, how_it_ended
from ggpo_offline.core.lifetime import exit_with_parent, quiet_resource_tracker
from ggpo_offline.train.checkpoint import resume_point
from ggpo_offline.train.config import DEFAULT_TIMEOUTS, Timeouts, TrainConfig
from ggpo_offline.train.distributed import FOLDER_VARIABLE, Ranks, check_split, last_doing
from ggpo_offline.train.run_folder import RunFolder, resume_hint
from ggpo_offline.train.trainer import TrainResult

# Which worker explains the job's end (see `_failure_line`).
USER, FAILURE, SILENT, LOST_PEER = "user", "failure", "silent", "lost peer"
CAUSE_ORDER = (USER, FAILURE, SILENT, LOST_PEER)


def launch(
    config: TrainConfig,
    nproc: int,
    resume: bool,
    overwrite: bool,
    progress=None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> TrainResult:
    """Train ``config`` in ``nproc`` processes (DDP over gloo on CPU / NCCL on GPUs, or FSDP2 with
    ``config.fsdp``); returns rank 0's result. ``progress(updates)`` is a picklable context-manager
    factory with ``update``/``evaluated`` methods, used by rank 0. A worker that fails, dies or gives up
    waiting ends the job with one `UserError` line: which process, what it was doing, how it ended and
    whether ``--resume`` can continue."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Before starting anything: a job size the minibatch or the resumed checkpoint does not fit. (A --resume
    # with no checkpoint is left to the workers, whose check names what the run folder lacks.)
    check_split(config.groups_per_batch, Ranks(world=nproc))
    folder = RunFolder(config.run_dir)
    if resume and folder.latest_checkpoint() is not None:
        resume_point(folder, config, Ranks(world=nproc))
    # The agent logs every worker failure (and each worker it stops) at length; our line says it once.
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    quiet_resource_tracker()
    launch_config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
    )
    with tempfile.TemporaryDirectory(prefix="ggpo-launch-") as reports:
        try:
            results = elastic_launch(launch_config, _worker)(
                config, resume, overwrite, reports, progress, timeouts
            )
        except ChildFailedError as failed:
            exits = {rank: failure.exitcode for rank, failure in failed.failures.items()}
            raise UserError(_failure_line(config, reports, nproc, exits)) from None
    return results[0]


def _failure_line(config: TrainConfig, reports: str, nproc: int, exits: dict[int, int]) -> str:
    """The job's end in one line. The cause, in this order: a worker's report of bad input, a worker's
    report of a failure it saw itself, a worker that ended without a word (killed by a signal: how, and
    what it was doing then), a worker's report that a peer stopped answering."""
    accounts = {
        r: json.loads(p.read_text()) for r in range(nproc) if (p := _report_file(reports, r)).is_file()
    }
    silent = {r: code for r, code in exits.items() if r not in accounts}

    def order(rank: int) -> tuple[int, int]:
        kind = accounts[rank]["kind"] if rank in accounts else SILENT
        return CAUSE_ORDER.index(kind), rank

    rank = min([*accounts, *silent], key=order)
    if rank in silent:
        doing = last_doing(reports, rank) or "starting"
        message = f"training process {rank} {how_it_ended(silent[rank])} while {doing}"
        return f"{message}; {resume_hint(config.run_dir)}"
    kind, message = accounts[rank]["kind"], accounts[rank]["message"]
    if kind == USER:
        return message
    if kind == LOST_PEER:
        others = [f"process {r} was last {last_doing(reports, r)}" for r in range(nproc) if r != rank]
        message = "; ".join([message, *others])
    return f"{message}; {resume_hint(config.run_dir)}"


def _report_file(reports: str, rank: int) -> Path:
    return Path(reports, f"rank-{rank:03d}.json")


def _worker(
    config: TrainConfig, resume: bool, overwrite: bool, reports: str, progress, timeouts: Timeouts
) -> TrainResult:
    """One rank: train; a failure it can name is written to ``reports`` before it exits (the launcher
    prints one line)."""
    from ggpo_offline.train.trainer import train

    os.environ[FOLDER_VARIABLE] = reports
    exit_with_parent()  # the launcher killed (kill -9 of the job): no orphan trains on
    rank = int(os.environ["RANK"])
    try:
        if rank != 0 or progress is None:
            return train(config, resume=resume, overwrite=overwrite, timeouts=timeouts)
        with progress(config.updates) as bar:
            return train(
                config,
                resume=resume,
                overwrite=overwrite,
                on_update=bar.update,
                on_eval=bar.evaluated,
                timeouts=timeouts,
            )
    except UserError as error:
        kind = (LOST_PEER if error.lost_peer else FAILURE) if isinstance(error, JobFailure) else USER
        _report_file(reports, rank).write_text(json.dumps({"kind": kind, "message": str(error)}))
        sys.exit(1)
