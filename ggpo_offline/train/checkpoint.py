"""Checkpoints: Hugging Face folders (loadable by vLLM) plus the state needed to resume exactly."""

import errno
import os
import re
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import torch

from ggpo_offline.core.errors import UserError, os_reason, stored_format
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import SINGLE_PROCESS, Ranks, barrier
from ggpo_offline.train.run_folder import STATE_FILE, RunFolder

# Below this much free space a failed save is reported as a full disk (see _refusal).
FULL_DISK_BYTES = 1 << 20
OS_ERROR = re.compile(r"\(os error (\d+)\)")
"""The errno in safetensors' message for a failed write: "I/O error: File too large (os error 27)"."""


def _rank_file(rank: int) -> str:
    return f"rank-{rank:03d}.pt"


def _stored(state) -> dict:
    """The fields as torch.save stores them, the tensors themselves (`asdict` would copy each one)."""
    return {f.name: getattr(state, f.name) for f in fields(state)}


@dataclass(frozen=True)
class RunState:
    """What resuming needs of the whole run (trainer_state.pt, written by rank 0), stored as a dict of these
    keys and its "format" (`FORMATS`; format 1, without the key, held the same). A checkpoint older than
    ``world`` reads with None."""

    FORMATS: ClassVar[tuple[int, ...]] = (1, 2)
    update: int
    """Updates done: the first update the resumed run takes."""
    optimizer: dict | None
    """The optimizer's state dict; None under FSDP2, where each rank keeps its shard (`RankState`)."""
    ess_log_weights: list
    """The unfinished ESS block's log weights (`EssBlock.log_weights`)."""
    torch_rng: Any
    run_id: str | None
    """The MLflow run the resumed run logs to."""
    config: dict
    """`TrainConfig.to_dict` of the run: resuming with other settings is refused."""
    world: int | None
    """Processes that trained it: resuming with another number is refused."""

    def to_dict(self) -> dict:
        return {"format": self.FORMATS[-1], **_stored(self)}

    @classmethod
    def from_dict(cls, data: dict, path: Path) -> "RunState":
        fields_ = _unversioned(data, cls.FORMATS, path)
        return cls(**{**fields_, "world": fields_.get("world")})


@dataclass(frozen=True)
class RankState:
    """What resuming needs of one rank (rank-NNN.pt), stored as a dict of these keys and its "format" (as
    `RunState`'s; a checkpoint written before the drift probe existed reads with no ``probe_pi0``)."""

    FORMATS: ClassVar[tuple[int, ...]] = (1, 2)
    ref_window: Any
    """This rank's π_ref log-probs for the updates until the next refresh (None: π0's)."""
    old_window: Any
    """This rank's π_old log-probs for the TIS block (None when the learner has no π_old)."""
    optimizer: dict | None
    """This rank's optimizer shard under FSDP2; None otherwise (`RunState.optimizer`)."""
    probe_pi0: Any = None
    """π0's log-probs on the drift probe (None without a probe)."""

    def to_dict(self) -> dict:
        return {"format": self.FORMATS[-1], **_stored(self)}

    @classmethod
    def from_dict(cls, data: dict, path: Path) -> "RankState":
        return cls(**_unversioned(data, cls.FORMATS, path))


def _unversioned(data: dict, readable: tuple[int, ...], path: Path) -> dict:
    """A stored state's fields, its format checked (`stored_format`)."""
    stored_format(data, readable, path)
    return {name: value for name, value in data.items() if name != "format"}


def save_checkpoint(
    path: Path,
    model,
    tokenizer,
    run_state: RunState | None,
    rank_state: RankState | None = None,
    ranks: Ranks = SINGLE_PROCESS,
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Every rank calls this. Rank 0 writes the model (``weights``, or the model's own), the tokenizer and
    ``run_state`` into a temporary folder, each rank adds its ``rank_state``, then rank 0 renames the folder
    into place: a crash mid-save leaves no half checkpoint and keeps the earlier ones."""
    tmp = path.with_name(f".tmp-{path.name}")
    with _removed_on_failure(path, tmp):
        if ranks.main:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, state_dict=weights)
            tokenizer.save_pretrained(tmp)
        barrier(ranks)
        if rank_state is not None:
            torch.save(rank_state.to_dict(), tmp / _rank_file(ranks.rank))
        barrier(ranks)
        if ranks.main:
            if run_state is not None:
                torch.save(run_state.to_dict(), tmp / STATE_FILE)  # last: a folder with it is complete
            _replace_folder(tmp, path)
        barrier(ranks)
    return path


@contextmanager
def _removed_on_failure(path: Path, tmp: Path) -> Iterator[None]:
    """A failed save removes its temporary folder; a full disk or unwritable folder becomes one UserError
    naming the checkpoint."""
    try:
        yield
    except BaseException as exc:
        # torch.save and safetensors report a refused write as RuntimeError / SafetensorError, not OSError,
        # so the storage (looked at before the partial folder is removed) tells what happened.
        other = isinstance(exc, Exception) and not isinstance(exc, OSError)
        refused = _refusal(exc, path.parent, tmp) if other else None
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write checkpoint {path}: {os_reason(exc)}") from exc
        if refused:
            raise UserError(f"cannot write checkpoint {path}: {refused}") from exc
        raise


def _refusal(exc: Exception, folder: Path, tmp: Path) -> str | None:
    """Why the storage refused the write that raised ``exc`` into ``tmp``, None when it did not: the errno
    safetensors names in its message, a full disk, or a file that reached this process's file-size limit
    (`ulimit -f`: torch writes up to it, then reports only "unexpected pos")."""
    named = OS_ERROR.search(str(exc))
    if named:
        return os.strerror(int(named.group(1)))
    try:
        if shutil.disk_usage(folder).free < FULL_DISK_BYTES:
            return os.strerror(errno.ENOSPC)
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        sizes = [f.stat().st_size for f in tmp.iterdir() if f.is_file()]
        if limit != resource.RLIM_INFINITY and any(size >= limit for size in sizes):
            return os.strerror(errno.EFBIG)
    except OSError:
        pass
    return None


def _replace_folder(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``. A folder cannot be renamed onto a non-empty one, so a previous checkpoint
    is moved aside first and only deleted once the new one is in place (moved back if the rename fails)."""
    if not path.exists():
        os.replace(tmp, path)
        return
    old = path.with_name(f".old-{path.name}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def load_state(path: Path, rank: int | None) -> tuple[RunState, RankState | None]:
    """(the run's state, ``rank``'s own state, None when ``rank`` is None)."""
    run_state = RunState.from_dict(torch.load(path / STATE_FILE, weights_only=False), path / STATE_FILE)
    if rank is None:
        return run_state, None
    rank_file = path / _rank_file(rank)
    return run_state, RankState.from_dict(torch.load(rank_file, weights_only=False), rank_file)


def resume_point(folder: RunFolder, config: TrainConfig, ranks: Ranks) -> Path:
    """The checkpoint ``--resume`` continues from, after checking it belongs to this run and job size."""
    checkpoint, path = folder.latest_checkpoint(), folder.path
    if checkpoint is None:
        raise UserError(f"--resume: {path} has no checkpoint to resume from")
    run_state, _ = load_state(checkpoint, rank=None)
    if run_state.world is None:
        raise UserError(f"--resume: {checkpoint} comes from an older ggpo-offline; start the run again")
    if run_state.config != config.to_dict():
        raise UserError(f"--resume: the settings differ from those of the run in {path}")
    if run_state.world != ranks.world:
        raise UserError(
            f"--resume: {path} was trained by {run_state.world} process(es); resume it with the same "
            f"number (now {ranks.world})"
        )
    return checkpoint
