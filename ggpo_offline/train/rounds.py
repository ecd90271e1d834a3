"""The pools a run trains on round by round (Algorithm 1, --sync-every N): the given pool first, then each
round's pool sampled by the checkpoint that starts it and recorded in the run folder (rounds/), which
``ggpo train --pool <run>/rounds`` replays as one ordered source."""

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ggpo_offline.core.errors import UserError, stored_format, write_json
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.pool_index import (
    CheckedPool,
    data_order_fingerprint,
    plan_minibatches,
    pool_fingerprint,
)

if TYPE_CHECKING:
    from ggpo_offline.generate.resample import PromptSource

ROUNDS = "rounds"
MANIFEST = "rounds.json"
MANIFEST_FORMATS = (1, 2)
"""The layouts of rounds.json this version reads, the last one written: {"format": 2, "rounds": [RoundRecord,
...]}; format 1 (no "format" key) also held the run's sync_every, groups_per_batch and updates, which
nothing read."""


@dataclass(frozen=True)
class RoundSchedule:
    """Where a --sync-every run's rounds start and which policy versions sample each (Algorithm 1; with
    --off-policy-steps K, asynchronous training).

    Fixed lag: round j ≥ 1 starts at a multiple of N and is sampled by the checkpoint of K updates before
    that; round 0, the given pool (π0's samples), covers every update before the first round whose sampler
    has trained. K = 0 gives Algorithm 1's synchronous rounds. Mixed lag (N = 1): each version v ≥ 1
    samples the G/K-group shares of the K updates after it, so that update t holds one share of each
    version t − 1 .. t − K (`shares`), the given pool standing in for versions ≤ 0; its rounds start where
    a fixed lag of 1 starts them, each named by its newest version."""

    updates: int
    sync_every: int
    off_policy_steps: int = 0
    mixed: bool = False

    @classmethod
    def of(cls, config: TrainConfig) -> "RoundSchedule":
        n, k = config.sync_every or config.updates, config.off_policy_steps
        return cls(config.updates, n, k, config.lag == "mixed")

    @property
    def lead(self) -> int:
        """Updates between a round's start and its newest sampler."""
        return min(self.off_policy_steps, 1) if self.mixed else self.off_policy_steps

    @property
    def starts(self) -> list[int]:
        """The first update of every round, round 0's (0) first."""
        n, k = self.sync_every, self.lead
        first_sampled = n * (k // n + 1)  # the first multiple of N whose sampler, K before it, has trained
        return [0, *range(first_sampled, self.updates, n)]

    def round_updates(self, index: int) -> int:
        """How many updates round ``index`` serves."""
        starts = [*self.starts, self.updates]
        return starts[index + 1] - starts[index]

    def version(self, index: int) -> int:
        """The policy version (updates trained) that samples round ``index`` (mixed: its newest); 0 for the
        pool."""
        return 0 if index == 0 else self.starts[index] - self.lead

    def shares(self, update: int) -> list[tuple[int, int]]:
        """Mixed lag: ``update``'s G/K-group shares, newest first, as (version, share of that version's
        sample); a version ≤ 0 is the given pool, whose shares are numbered in the order updates take them."""
        k = self.off_policy_steps
        pool_share = sum(max(k - t + 1, 0) for t in range(self.starts[1], update))
        shares = []
        for age in range(1, k + 1):
            version = update - age
            shares.append((version, age - 1) if version >= 1 else (0, pool_share))
            pool_share += version < 1
        return shares

    def sampled_shares(self, version: int) -> int:
        """Mixed lag: the G/K-group shares version ``version`` samples (those of the K updates after it)."""
        return max(min(self.off_policy_steps, self.updates - 1 - version), 0)

    def sampled_groups(self, index: int, groups_per_batch: int) -> int:
        """The mixed groups round ``index``'s sampler keeps: its updates' G each, or with a mixed lag the
        G/K shares of its version."""
        if self.mixed:
            return self.sampled_shares(self.version(index)) * groups_per_batch // self.off_policy_steps
        return self.round_updates(index) * groups_per_batch

    @property
    def pool_shares(self) -> int:
        """Mixed lag: the given pool's shares after round 0's updates."""
        return sum(version < 1 for t in self.starts[1:] for version, _ in self.shares(t))


@dataclass(frozen=True)
class RoundRecord:
    """What rounds.json keeps of one round: enough to replay it without sampling."""

    index: int
    start: int
    """The round's first update."""
    pool: str
    """Its pool: round 0's as the run was given it (absolute), the others' file name in rounds/."""
    pool_fingerprint: str
    plan: list[list[int]]
    """``[n, G]`` group ids of its n updates."""
    sampled_by: str | None
    """The checkpoint that sampled it (None: the given pool)."""
    next_prompt: int | None
    """The dataset position the next round starts at (None: the run samples no round after this one)."""


@dataclass(frozen=True)
class Round:
    """One round as the trainer reads it."""

    record: RoundRecord
    pool: CheckedPool

    @property
    def start(self) -> int:
        return self.record.start

    @property
    def plan(self) -> np.ndarray:
        return np.array(self.record.plan, dtype=np.int64)


def rounds_folder(run_dir: Path) -> Path:
    return Path(run_dir) / ROUNDS


def is_recorded_rounds(pool: Path | str) -> bool:
    """Whether --pool names a run's rounds/ folder (replayed as one source) rather than a pool."""
    return (Path(pool) / MANIFEST).is_file()


def read_records(folder: Path) -> list[RoundRecord]:
    """The rounds recorded in ``folder`` (rounds/), in order; none when it has no manifest yet."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return []
    try:
        stored = json.loads(path.read_text())
        stored_format(stored, MANIFEST_FORMATS, path)
        return [RoundRecord(**record) for record in stored["rounds"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{path} cannot be read as a run's rounds ({type(error).__name__})") from None


def write_records(folder: Path, records: list[RoundRecord]) -> None:
    write_json(
        {"format": MANIFEST_FORMATS[-1], "rounds": [asdict(record) for record in records]},
        Path(folder) / MANIFEST,
    )


def round_pool_path(folder: Path, record: RoundRecord) -> Path:
    return Path(record.pool) if record.index == 0 else Path(folder) / record.pool


def recorded_plan(records: list[RoundRecord], updates: int) -> np.ndarray:
    """``[updates, G]`` group ids: the rounds' plans one after the other."""
    return np.concatenate([np.array(r.plan, dtype=np.int64) for r in records])[:updates]


def rounds_fingerprints(records: list[RoundRecord], updates: int) -> tuple[str, str]:
    """(pool, data order) fingerprints of ``updates`` updates of recorded rounds: a replay of them reports
    the run's own."""
    plan = recorded_plan(records, updates)
    if len(records) == 1:
        return records[0].pool_fingerprint, data_order_fingerprint(plan)
    pools = hashlib.sha256(" ".join(r.pool_fingerprint for r in records).encode()).hexdigest()
    return pools, data_order_fingerprint(plan)


def first_record(pool: CheckedPool, plan: np.ndarray, source: "PromptSource | None") -> RoundRecord:
    """Round 0: the given pool, its first N minibatches planned as an offline run plans them."""
    return RoundRecord(
        index=0,
        start=0,
        pool=str(Path(pool.path).resolve()),
        pool_fingerprint=pool.fingerprint,
        plan=plan.tolist(),
        sampled_by=None,
        next_prompt=None if source is None else source.next_prompt,
    )


def sampled_record(
    config: TrainConfig, index: int, pool: CheckedPool, sampled_by: Path, next_prompt: int
) -> RoundRecord:
    """Round ``index`` (≥ 1), sampled by the checkpoint ``sampled_by`` into ``pool``: its minibatches are
    a seeded permutation of its N·G groups, as an offline run plans a pool."""
    schedule = RoundSchedule.of(config)
    updates = schedule.round_updates(index)
    plan = plan_minibatches(pool.index, config.seed, updates, config.groups_per_batch)
    return RoundRecord(
        index=index,
        start=schedule.starts[index],
        pool=Path(pool.path).name,
        pool_fingerprint=pool.fingerprint,
        plan=plan.tolist(),
        sampled_by=str(sampled_by),
        next_prompt=next_prompt,
    )


def replayed_records(config: TrainConfig) -> list[RoundRecord]:
    """The recorded rounds --pool names, checked against this run's settings and their pools."""
    folder = Path(config.pool)
    records = read_records(folder)
    recorded_updates, recorded_groups = sum(len(r.plan) for r in records), len(records[0].plan[0])
    if config.sync_every is not None:
        raise UserError(
            f"{folder} holds a run's recorded rounds, replayed as they were sampled: give --sync-every only "
            "with a pool"
        )
    if recorded_groups != config.groups_per_batch:
        raise UserError(
            f"{folder} was recorded with --groups-per-batch {recorded_groups}; replay it with the same (got "
            f"{config.groups_per_batch})"
        )
    if recorded_updates < config.updates:
        raise UserError(
            f"{folder} holds {recorded_updates} updates in {len(records)} rounds; lower --updates to at most "
            f"{recorded_updates}"
        )
    for record in records:  # each is validated and indexed where its round is entered
        path = round_pool_path(folder, record)
        if pool_fingerprint(path) != record.pool_fingerprint:
            raise UserError(f"{path} is not the pool round {record.index} of {folder} was recorded with")
    return [r for r in records if r.start < config.updates]
