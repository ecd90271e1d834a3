"""The pool as training reads it (validated, indexed and fingerprinted once per command) and the data plan:
which mixed-reward groups each update uses, fixed by the pool and the seed alone."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.info import PoolInfo, PoolSampling
from ggpo_offline.pool.source import PoolSource, open_pool
from ggpo_offline.pool.validate import validate_pool


@dataclass(frozen=True)
class PoolIndex:
    """What planning needs from a pool, read by streaming two columns."""

    mixed_group_ids: np.ndarray
    """Group ids with 0 < Σr < m, in pool order."""
    row_groups_of: dict[int, tuple[int, ...]]
    """Parquet row groups holding each mixed group's rows."""
    group_size: int
    total_groups: int
    rows: int


def index_pool(pool: Path | PoolSource) -> PoolIndex:
    """Stream ``group_id`` and ``reward`` row group by row group and keep the mixed-reward groups.

    ``pool`` is a pool file or a shard directory, or one opened (`open_pool`); row groups are numbered
    across its files (see ``RowGroups``). A directory's mixed groups are listed by ascending group id, the
    order of the file ``ggpo pool merge`` writes from it, so both plan the same minibatches.
    """
    source = pool if isinstance(pool, PoolSource) else open_pool(pool)
    m = source.info.sampling.m
    row_group_reader = source.row_groups
    mixed: list[int] = []
    row_groups_of: dict[int, tuple[int, ...]] = {}
    total = rows = 0
    current: list = []  # [group_id, correct, row groups] of the group being read

    def close_group() -> None:
        if current and 0 < current[1] < m:  # SPEC "Mixed-reward filtering": the same rule for every method
            mixed.append(current[0])
            row_groups_of[current[0]] = tuple(current[2])

    for row_group in range(len(row_group_reader)):
        table = row_group_reader.read(row_group, columns=["group_id", "reward"])
        for gid, reward in zip(
            table.column("group_id").to_pylist(), table.column("reward").to_pylist(), strict=True
        ):
            if not current or gid != current[0]:
                close_group()
                current = [gid, 0.0, [row_group]]
                total += 1
            elif current[2][-1] != row_group:
                current[2].append(row_group)
            current[1] += reward
        rows += table.num_rows
    close_group()
    if len(source.files) > 1:
        mixed.sort()
    return PoolIndex(np.array(mixed, dtype=np.int64), row_groups_of, m, total, rows)


def plan_minibatches(index: PoolIndex, seed: int, updates: int, groups_per_batch: int) -> np.ndarray:
    """``[U, G]`` group ids: a seeded permutation of the mixed groups cut into U minibatches of G groups.

    The plan depends only on the pool and the seed, never on the method, so every learner trained with
    the same seed sees the same minibatches in the same order, each exactly once.
    """
    needed = updates * groups_per_batch
    available = len(index.mixed_group_ids)
    if available < needed:
        raise UserError(
            f"the pool has {available} mixed-reward groups but {updates} updates x {groups_per_batch} groups "
            f"need {needed}; lower --updates or --groups-per-batch, or generate a larger pool"
        )
    order = np.random.default_rng(seed).permutation(available)[:needed]
    return index.mixed_group_ids[order].reshape(updates, groups_per_batch)


def data_order_fingerprint(plan: np.ndarray) -> str:
    """sha256 of the planned group-id sequence."""
    return hashlib.sha256(np.ascontiguousarray(plan, dtype="<i8").tobytes()).hexdigest()


def pool_fingerprint(pool: Path | PoolSource) -> str:
    """sha256 of the pool metadata and its row count (identifies the data, not the file bytes).

    A shard directory and the file ``ggpo pool merge`` writes from it have the same fingerprint."""
    source = pool if isinstance(pool, PoolSource) else open_pool(pool)
    found = {"metadata": source.metadata, "rows": source.rows}
    return hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CheckedPool:
    """A pool read once for a whole command: validated (its footer parsed), indexed, fingerprinted."""

    path: Path
    info: PoolInfo
    index: PoolIndex
    fingerprint: str
    """`pool_fingerprint`."""
    source: PoolSource
    """The pool opened, which the run's minibatches are read from."""


def check_pool(path: Path | str) -> CheckedPool:
    """Validate the pool (`validate_pool`: one line naming the first problem), index and fingerprint it,
    all on the one opening that validation made."""
    path = Path(path)
    source = validate_pool(path).source
    return CheckedPool(path, source.info, index_pool(source), pool_fingerprint(source), source)


def _setting(pool: Path, sampling: PoolSampling, key: str, default: float) -> float:
    value = getattr(sampling, key)
    value = default if value is None else value  # older pools: the setting's default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{pool}: metadata sampling.{key} is {value!r}, expected a number")
    return value


def learner_temperature(pool: Path, sampling: PoolSampling) -> float:
    """The temperature every log-prob of a run on the pool uses: the sampling temperature of its behavior
    log-probs (1.0 when the metadata has none), or the --learner-temperature it was generated with.

    Engines store log-probs of the processed distribution, softmax(logits / T), so every log-prob the
    trainer compares with them (learner, reference, old policy, π0) divides its logits by the same T, as
    the major RL libraries do; a pool generated with another learner temperature makes the learner compute
    a distribution other than the sampler's on purpose (a mismatch dose).
    """
    learner = sampling.learner_temperature
    key = "temperature" if learner is None else "learner_temperature"
    temperature = _setting(pool, sampling, key, 1.0)
    if not temperature > 0:
        raise UserError(f"{pool}: metadata sampling.{key} is {temperature!r}, expected > 0")
    return float(temperature)


def check_sampling(pool: Path, sampling: PoolSampling, allow_truncated: bool) -> float:
    """The pool's temperature, after refusing a pool sampled from a truncated distribution (top-p < 1 or
    top-k > 0) unless ``allow_truncated``."""
    top_p, top_k = _setting(pool, sampling, "top_p", 1.0), _setting(pool, sampling, "top_k", 0)
    truncation = ", ".join(
        ([f"top-p {top_p}"] if top_p < 1 else []) + ([f"top-k {top_k}"] if top_k > 0 else [])
    )
    if truncation and not allow_truncated:
        raise UserError(
            f"{pool} was sampled with {truncation}: its behavior log-probs are of the truncated "
            "distribution, which the learner's full-vocabulary log-probs cannot match (ratios, TIS weights "
            "and mismatch would be biased); pass --allow-truncated-sampling to train anyway"
        )
    return learner_temperature(pool, sampling)
