"""`ggpo train --nproc N`: N training processes on this machine, started by torch's elastic launcher
(what `torchrun --standalone` runs), with a worker's error brought back as one line."""

import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import Ranks, check_split
from ggpo_offline.train.trainer import TrainResult


def launch(config: TrainConfig, nproc: int, resume: bool, overwrite: bool, progress=None) -> TrainResult:
    """Train ``config`` in ``nproc`` processes (DDP over gloo on CPU / NCCL on GPUs, or FSDP2 with
    ``config.fsdp``); returns rank 0's result. ``progress(updates)`` is a picklable context-manager
    factory with ``update``/``evaluated`` methods, used by rank 0."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_split(config.groups_per_batch, Ranks(world=nproc))  # before starting anything
    # The agent logs every worker failure at length; the failing worker's own line says what went wrong.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
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
    with tempfile.TemporaryDirectory(prefix="ggpo-launch-") as errors:
        try:
            results = elastic_launch(launch_config, _worker)(config, resume, overwrite, errors, progress)
        except ChildFailedError as failed:
            messages = sorted(Path(errors).glob("rank-*.txt"))
            if messages:
                raise UserError(messages[0].read_text()) from None
            rank, failure = failed.get_first_failure()
            raise UserError(
                f"training process {rank} failed (exit code {failure.exitcode}); see its output above"
            ) from None
    return results[0]


def _worker(config: TrainConfig, resume: bool, overwrite: bool, errors: str, progress) -> TrainResult:
    """One rank: train, reporting a UserError through ``errors`` (the launcher prints one line)."""
    from ggpo_offline.train.trainer import train

    rank = int(os.environ["RANK"])
    try:
        if rank != 0 or progress is None:
            return train(config, resume=resume, overwrite=overwrite)
        with progress(config.updates) as bar:
            return train(
                config, resume=resume, overwrite=overwrite, on_update=bar.update, on_eval=bar.evaluated
            )
    except UserError as error:
        Path(errors, f"rank-{rank:03d}.txt").write_text(str(error))
        sys.exit(1)
