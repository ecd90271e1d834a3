"""The π0 log-prob cache: the initial model's token log-probs of a pool's mixed groups, scored once.

GRPO and GRPO+TIS keep the initial model as their reference, and GGPO/AGRO use it until their first
refresh, so a comparison needs π0's log-probs of the same responses in every run. ``score_pool`` computes
them once with the learner's numerics and stores them beside the pool, keyed by the pool fingerprint, the
model's weight hash, the numerics and the pool's learner temperature; ``Pi0Cache`` serves them per
minibatch and refuses a mismatch.
"""

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from ggpo_offline.core.errors import UserError, writing
from ggpo_offline.core.model_io import initial_model_dir, load_tokenizer, weights_sha256
from ggpo_offline.pool.schema import PARQUET_OPTIONS, open_parquet
from ggpo_offline.train.distributed import cast_parameters, compute_dtype, device_of
from ggpo_offline.train.logprobs import response_logprobs
from ggpo_offline.train.minibatch import Minibatch, MinibatchReader
from ggpo_offline.train.pool_index import CheckedPool, check_pool, learner_temperature

CACHE_KEY = b"ggpo_offline_pi0"
CACHE_SCHEMA = pa.schema(
    [
        pa.field("group_id", pa.int64(), nullable=False),
        pa.field("sample_idx", pa.int16(), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
    ]
)
GROUPS_PER_PASS = 8


def numerics(device: torch.device, sharded: bool = False, packed: bool = True) -> str:
    """The learner's numerics (`compute_dtype`, autocast, packed or padded forwards): a cache is only
    valid for the same ones."""
    layout = "packed" if packed else "padded"
    if device.type != "cuda":
        return f"fp32 (cpu), {layout}"
    weights = "bf16 weights (FSDP2)" if compute_dtype(device, sharded) == torch.bfloat16 else "fp32 weights"
    return f"{weights}, bf16 autocast (cuda), {layout}"


def cache_path(pool: Path, key: dict) -> Path:
    """``pools/base.pi0-<weights sha256, 16 hex>.parquet`` beside the pool, or under
    ``~/.cache/ggpo-offline/pi0/`` when the pool's folder is read-only (a shared pool)."""
    pool = Path(pool)
    name = f"{pool.stem}.pi0-{key['weights_sha256'][:16]}.parquet"
    if os.access(pool.parent, os.W_OK):
        return pool.with_name(name)
    return Path.home() / ".cache" / "ggpo-offline" / "pi0" / f"{key['pool_fingerprint'][:16]}-{name}"


def cache_key(
    pool: CheckedPool,
    model_dir: Path,
    device: torch.device,
    temperature: float,
    sharded: bool,
    packed: bool = True,
) -> dict:
    """What a cache is valid for: this pool's data, these initial weights, numerics and temperature."""
    return {
        "pool_fingerprint": pool.fingerprint,
        "weights_sha256": weights_sha256(model_dir),
        "numerics": numerics(device, sharded, packed),
        "temperature": temperature,
    }


def _read_key(path: Path) -> dict | None:
    try:
        raw = (pq.ParquetFile(path).metadata.metadata or {}).get(CACHE_KEY)
        return None if raw is None else json.loads(raw)
    except (OSError, pa.ArrowInvalid, json.JSONDecodeError):
        return None


def score_pool(
    pool: CheckedPool,
    model_dir: Path,
    device: torch.device,
    temperature: float,
    on_progress: Callable[[int, int], None] | None = None,
    sharded: bool = False,
    packed: bool = True,
    model: torch.nn.Module | None = None,
) -> "Pi0Cache":
    """Write (or find) the π0 cache of ``pool`` for ``model_dir`` and open it; ``temperature``: the pool's
    (`learner_temperature`), as the learner's log-probs use it; ``sharded``: for a learner that FSDP2 shards
    (on CUDA its weights compute in bf16, and so do π0's here); ``packed``: scored with packed forwards, as
    a learner without --no-packing runs; ``model``: ``model_dir``'s, already loaded (`scoring_model`). An
    existing cache is reused only when its key (`cache_key`) matches; a stale one is replaced. Written
    through a temporary file renamed into place."""
    key = cache_key(pool, model_dir, device, temperature, sharded, packed)
    target = cache_path(pool.path, key)
    if target.is_file() and _read_key(target) == key:
        return Pi0Cache(target, key)
    index = pool.index
    tokenizer = load_tokenizer(model_dir)
    # Its own opening: this may run in a thread beside the training that reads the pool's shared one.
    reader = MinibatchReader(pool.path, index, pad_id=tokenizer.pad_token_id or 0)
    model = scoring_model(model_dir, device, sharded) if model is None else model
    groups = index.mixed_group_ids.tolist()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with writing(target):  # disk full or folder not writable: one UserError naming the cache
        target.parent.mkdir(parents=True, exist_ok=True)
        writer = pq.ParquetWriter(tmp, CACHE_SCHEMA, **PARQUET_OPTIONS)
    try:
        for start in range(0, len(groups), GROUPS_PER_PASS):
            batch = reader.read(groups[start : start + GROUPS_PER_PASS])
            with torch.no_grad():
                logp = response_logprobs(model, batch, temperature=temperature, packed=packed)[0].cpu()
            lengths = batch.mask.sum(dim=1).long().tolist()
            table = pa.table(
                {
                    "group_id": [gid for gid in batch.group_ids for _ in range(batch.group_size)],
                    "sample_idx": list(range(batch.group_size)) * len(batch.group_ids),
                    "logprobs": [logp[i, :n].tolist() for i, n in enumerate(lengths)],
                },
                schema=CACHE_SCHEMA,
            )
            with writing(target):
                writer.write_table(table)
            if on_progress is not None:
                on_progress(min(start + GROUPS_PER_PASS, len(groups)), len(groups))
        with writing(target):
            writer.add_key_value_metadata({CACHE_KEY: json.dumps(key)})
            writer.close()
            os.replace(tmp, target)
    except BaseException:
        with suppress(Exception):  # the partial file is discarded; closing it may fail as the write did
            writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return Pi0Cache(target, key)


def ensure_pi0_cache(
    pool: Path, model: str | None = None, on_progress: Callable[[int, int], None] | None = None
) -> tuple[CheckedPool, "Pi0Cache"]:
    """``ggpo pool score``: check the pool, resolve its initial model (``model`` or the pool's own) and
    score it on the learner's device unless a matching cache exists; the pool as checked, and its cache."""
    checked = check_pool(pool)
    model_dir = initial_model_dir(model, checked.info.model.location)
    temperature = learner_temperature(checked.path, checked.info.sampling)
    return checked, score_pool(checked, model_dir, device_of(), temperature, on_progress)


def scoring_model(model_dir: Path, device: torch.device, sharded: bool = False) -> torch.nn.Module:
    """``model_dir``'s model as `score_pool` runs it: float32 weights in the learner's compute dtype."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    cast_parameters(model, compute_dtype(device, sharded))
    return model


class ScoringCache:
    """A `Pi0Cache` that another thread of this process is scoring (`score_pi0`'s ``beside``): reading it
    waits for that thread."""

    def __init__(self, scoring: "Future[Pi0Cache]"):
        self.scoring = scoring

    def resolved(self) -> tuple["Pi0Cache", float]:
        """The scored cache, and the seconds waited for it (0 when the scoring had ended)."""
        start = time.perf_counter()
        cache = self.scoring.result()
        return cache, time.perf_counter() - start

    def logprobs(self, batch: Minibatch) -> torch.Tensor:
        return self.scoring.result().logprobs(batch)


class Pi0Cache:
    """Serves cached π0 log-probs laid out like a minibatch's ``(B, T)`` tensors."""

    def __init__(self, path: Path, key: dict):
        if _read_key(path) != key:
            raise UserError(f"{path} is not the π0 cache of this pool and model; run `ggpo pool score` again")
        self.path = path
        self.parquet = open_parquet(path)
        self.row_groups_of: dict[int, list[int]] = {}
        for row_group in range(self.parquet.num_row_groups):
            ids = self.parquet.read_row_group(row_group, columns=["group_id"]).column("group_id")
            for gid in pc.unique(ids).to_pylist():
                self.row_groups_of.setdefault(gid, []).append(row_group)

    def logprobs(self, batch: Minibatch) -> torch.Tensor:
        row_groups = sorted({rg for gid in batch.group_ids for rg in self.row_groups_of[gid]})
        table = self.parquet.read_row_groups(row_groups)
        table = table.filter(pc.is_in(table.column("group_id"), pa.array(batch.group_ids, pa.int64())))
        found = {(row["group_id"], row["sample_idx"]): row["logprobs"] for row in table.to_pylist()}
        out = torch.zeros(batch.response_ids.shape)
        for i, gid in enumerate(batch.group_ids):
            for j in range(batch.group_size):
                values = found[gid, j]
                out[i * batch.group_size + j, : len(values)] = torch.tensor(values)
        return out
