"""torch.distributed for the learner: the process group, each rank's share of a minibatch, DDP / FSDP2
wrapping, the reductions that make an N-process update equal the 1-process one, and what each process is
doing, kept for the launcher."""

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ggpo_offline.core.errors import JobFailure, UserError
from ggpo_offline.train.config import DEFAULT_TIMEOUTS, Timeouts

# gloo's words for a peer that stopped answering (a timeout) or vanished (its socket closed).
PEER_LOST = ("Timed out", "timeout", "Connection closed by peer", "Connection reset by peer", "pair closure")


_solo_group = None  # a gloo group whose barrier waits up to Timeouts.solo


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job; ``world == 1`` is the plain single-process run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


SINGLE_PROCESS = Ranks()


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a plain process (known before the process group starts)."""
    return os.environ.get("RANK", "0") == "0"


def init_ranks(timeouts: Timeouts = DEFAULT_TIMEOUTS) -> Ranks:
    """Join the job torchrun started (``WORLD_SIZE``/``RANK``/``LOCAL_RANK``): NCCL on GPUs, gloo on CPU;
    collectives give up after ``timeouts.collective``."""
    global _solo_group
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return SINGLE_PROCESS
    ranks = Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(ranks.local_rank)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeouts.collective))
        _solo_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeouts.solo))
    return ranks


def device_of(ranks: Ranks = SINGLE_PROCESS) -> torch.device:
    """The learner's device: this rank's GPU when there is one."""
    return torch.device("cuda", ranks.local_rank) if torch.cuda.is_available() else torch.device("cpu")


def compute_dtype(device: torch.device, sharded: bool) -> torch.dtype:
    """The dtype the learner's weights compute in: bf16 when FSDP2 shards them on CUDA (its mixed-precision
    policy gathers bf16 copies), else fp32 (CUDA's bf16 autocast casts only the matmul inputs)."""
    return torch.bfloat16 if sharded and device.type == "cuda" else torch.float32


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The parameters (not the buffers, e.g. rotary tables) in ``dtype``, as FSDP2's mixed-precision policy
    computes with them: a model cast so gives the sharded learner's log-probs exactly (tested)."""
    for parameter in model.parameters():
        parameter.data = parameter.data.to(dtype)
    return model


def check_split(groups_per_batch: int, ranks: Ranks) -> None:
    if groups_per_batch % ranks.world:
        raise UserError(
            f"--groups-per-batch {groups_per_batch} does not split evenly over {ranks.world} processes; "
            "choose G divisible by the number of processes"
        )


def rank_groups(group_ids: list[int], ranks: Ranks) -> list[int]:
    """This rank's contiguous block of a minibatch's groups: groups never straddle ranks, and every rank
    gets the same number (so all ranks run the same number of collectives)."""
    share = len(group_ids) // ranks.world
    return group_ids[ranks.rank * share : (ranks.rank + 1) * share]


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        dist.barrier()


def wait_for_main(ranks: Ranks) -> None:
    """A barrier after rank 0 worked alone: the others wait up to ``Timeouts.solo``, not the collective
    timeout."""
    if ranks.distributed:
        dist.barrier(group=_solo_group)


def peer_lost(error: BaseException) -> bool:
    """Whether a collective failed because another process stopped answering or died."""
    return isinstance(error, RuntimeError) and any(words in str(error) for words in PEER_LOST)


def lost_peer_failure(ranks: Ranks, timeouts: Timeouts) -> JobFailure:
    return JobFailure(
        f"process {ranks.rank} stopped waiting for the others: one ended or stopped answering "
        f"(--collective-timeout {timeouts.collective:g} s; --wait-timeout {timeouts.solo:g} s while "
        "process 0 works alone)",
        lost_peer=True,
    )


def _on_backend_device(value: torch.Tensor) -> torch.Tensor:
    """NCCL reduces CUDA tensors only; gloo takes CPU ones."""
    if dist.get_backend() == "nccl":
        return value.to(torch.device("cuda", torch.cuda.current_device()))
    return value.cpu()


def all_sum(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Σ over ranks, on the input's device (a copy; the input is left alone)."""
    if not ranks.distributed:
        return value.detach().clone()
    total = _on_backend_device(value.detach()).clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(value.device)


def all_max(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """max over ranks, on the input's device (a copy)."""
    if not ranks.distributed:
        return value.detach().clone()
    top = _on_backend_device(value.detach()).clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return top.to(value.device)


def all_cat(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Every rank's equally sized tensor, concatenated in rank order along dim 0, on the input's device."""
    value = value.detach().contiguous()
    if not ranks.distributed:
        return value
    local = _on_backend_device(value)
    parts = [torch.empty_like(local) for _ in range(ranks.world)]
    dist.all_gather(parts, local)
    return torch.cat(parts).to(value.device)


def wrap(module: torch.nn.Module, ranks: Ranks, fsdp: bool) -> torch.nn.Module:
    """DDP (gloo or NCCL) or, with ``fsdp``, FSDP2 ``fully_shard`` per decoder layer and at the root; bf16
    compute with fp32 master weights and fp32 gradient reduction on GPU. One process: unchanged."""
    if not ranks.distributed:
        return module
    if not fsdp:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [ranks.local_rank] if torch.cuda.is_available() else None
        # Buffers (rotary tables) are constants: no need to broadcast them at every forward.
        return DistributedDataParallel(module, device_ids=device_ids, forward_sync_buffers=False)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=compute_dtype(device_of(ranks), True), reduce_dtype=torch.float32
    )
    for layer in module.model.get_decoder().layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(module, mp_policy=policy)
    return module


def _is_fsdp(module: torch.nn.Module) -> bool:
    return hasattr(module, "set_requires_gradient_sync")


@contextmanager
def gradient_sync(module: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Backward passes inside reduce gradients across ranks (``enabled``) or only accumulate them locally
    (every micro-batch but a minibatch's last)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel) and not enabled:
        with module.no_sync():
            yield
    elif _is_fsdp(module) and not enabled:
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    else:
        yield


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """FSDP2: the unsharded weights, on CPU, keyed as in the unwrapped model (a collective: every rank
    calls it, rank 0 receives them). Otherwise None: the unwrapped model's own weights are complete."""
    if not _is_fsdp(module):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # Gathered copies do not share memory: keep one name per tied parameter (the embedding, not the
    # head), as save_pretrained would from the model itself.
    first_name: dict[int, str] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        first_name.setdefault(id(parameter), name)
    kept = set(first_name.values()) | {name for name, _ in module.named_buffers()}
    return {key.removeprefix("model."): value for key, value in weights.items() if key in kept}


def scalar(value: torch.Tensor) -> float:
    """A Python float from a plain tensor or a DTensor (FSDP2's gradient norm)."""
    return float(value.full_tensor() if hasattr(value, "full_tensor") else value)


# What each process of a training job is doing, kept in a file that outlives it: a process killed by a signal
# cannot say what it was doing, so the launcher reads it there.
FOLDER_VARIABLE = "GGPO_ACTIVITY_DIR"  # set by the launcher in each worker; unset, nothing is written
# "<rank>:<activity>", or several joined by commas: that process stops itself (SIGSTOP) on reaching each
# activity, so that a test or the chaos run can freeze or kill it at an exact point instead of at a moment
# that depends on the machine's load.
STOP_VARIABLE = "GGPO_STOP_AT"
_on_doing: dict[str, Callable[[str], None]] = {}
"""Called with each activity this process reaches: empty unless a run asked for a stop (`stop_when_asked`)."""


def launched_by_ggpo() -> bool:
    """Whether this process is a worker of `ggpo train --nproc` (whose launcher reports its failures)."""
    return FOLDER_VARIABLE in os.environ


def activity_file(folder: Path | str, rank: int) -> Path:
    return Path(folder, f"rank-{rank:03d}.doing")


def doing(what: str) -> None:
    """Record that this process is now ``what`` ("training update 4"); a no-op outside the launcher."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if folder is not None:
        path = activity_file(folder, int(os.environ.get("RANK", "0")))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(what)
        os.replace(tmp, path)  # the launcher never reads half a line
    for reached in _on_doing.values():
        reached(what)


def stop_when_asked(ranks: Ranks) -> None:
    """Read `STOP_VARIABLE` once, where a run starts: set to "<rank>:<activity>" points (comma-separated),
    `doing` stops this process on reaching each of its own; unset, `doing` calls nothing more."""
    given = os.environ.get(STOP_VARIABLE)
    if given is None:
        _on_doing.pop(STOP_VARIABLE, None)
        return
    points = set(given.split(","))

    def stop_at_point(what: str) -> None:
        if f"{ranks.rank}:{what}" in points:
            os.kill(os.getpid(), signal.SIGSTOP)

    _on_doing[STOP_VARIABLE] = stop_at_point


def last_doing(folder: Path | str, rank: int) -> str | None:
    """What process ``rank`` last recorded, None when it recorded nothing."""
    path = activity_file(folder, rank)
    return path.read_text() if path.is_file() else None
