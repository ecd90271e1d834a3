"""A run's inputs, each checked before the run writes anything: pool, initial model, data plan and π0.

`train` reads them all with `read_inputs`; `ggpo compare` plans every run first with `plan_data` alone, so
this module loads torch only inside the functions that need it: a refused compare command answers in a
second or two instead of after the imports.
"""

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import initial_model_dir, load_tokenizer, tokenizer_sha256
from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.pool_index import (
    CheckedPool,
    PoolIndex,
    check_pool,
    check_sampling,
    data_order_fingerprint,
    plan_minibatches,
)
from ggpo_offline.train.rounds import RoundSchedule

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from ggpo_offline.generate.resample import PromptSource
    from ggpo_offline.train.distributed import Ranks
    from ggpo_offline.train.pi0_cache import Pi0Cache, ScoringCache
    from ggpo_offline.train.rounds import RoundRecord


@dataclass(frozen=True)
class Fingerprints:
    """What identifies a run's data: the pool it reads and the order it replays its minibatches in. Runs
    of one comparison share the pool's, and each seed's runs the data order's."""

    pool_fingerprint: str
    """`pool_fingerprint` of the pool file or shard directory (sha256)."""
    data_order_fingerprint: str
    """`data_order_fingerprint` of the planned minibatches (sha256)."""

    def to_dict(self) -> dict[str, str]:
        """The two keys as config.json and result.json store them (and the run's MLflow tags)."""
        return asdict(self)


@dataclass(frozen=True)
class DataPlan:
    """The minibatches a run replays and the fingerprints that identify its pool and their order."""

    plan: np.ndarray
    """``[U, G]`` group ids: update u trains on the groups ``plan[u]``."""
    fingerprints: Fingerprints


@dataclass(frozen=True)
class RunInputs:
    """What a run reads, each checked, before it writes anything."""

    pool: CheckedPool
    model_dir: Path
    tokenizer: object
    temperature: float
    """The pool's learner temperature (`learner_temperature`), which every log-prob of the run uses."""
    plan: np.ndarray
    """The planned minibatches of the pool (of its first round only, with --sync-every)."""
    fingerprints: Fingerprints
    prompt_source: "PromptSource | None" = None
    """Where a --sync-every run samples its rounds (None: it has no round to sample)."""
    recorded: "list[RoundRecord] | None" = None
    """The rounds a replay of a run's rounds/ trains on (None: a pool is trained on)."""

    @property
    def info(self) -> PoolInfo:
        return self.pool.info

    @property
    def index(self) -> PoolIndex:
        return self.pool.index

    @property
    def filtered_frac(self) -> float:
        """`train/filtered_frac`: the share of the pool's groups the mixed-reward filter removes."""
        return 1 - len(self.index.mixed_group_ids) / self.index.total_groups

    @property
    def tracking_params(self) -> dict:
        """The MLflow params a run adds to its settings: model_dir and the pool's sampling settings as
        stored (pool_temperature, pool_top_p, ...; not its seed)."""
        sampling = self.info.sampling.to_dict()
        return {
            "model_dir": str(self.model_dir),
            **{f"pool_{k}": v for k, v in sampling.items() if k != "seed"},
        }


def plan_data(config: TrainConfig, index: PoolIndex, pool_print: str) -> DataPlan:
    """The run's minibatches (`plan_minibatches`) on the pool indexed by ``index``, whose
    `pool_fingerprint` is ``pool_print``: with --sync-every, its first round's (`RoundSchedule`)."""
    updates = RoundSchedule.of(config).round_updates(0)
    plan = plan_minibatches(index, config.seed, updates, config.groups_per_batch)
    return DataPlan(plan, Fingerprints(pool_print, data_order_fingerprint(plan)))


def check_tokenizer(config: TrainConfig, info: PoolInfo, tokenizer) -> None:
    if info.tokenizer_sha256 != tokenizer_sha256(tokenizer) and not config.allow_tokenizer_mismatch:
        raise UserError(
            f"{config.pool} was generated with a different tokenizer than the model being trained "
            "(tokenizer sha256 differs); pass --allow-tokenizer-mismatch to train anyway"
        )


def read_inputs(
    config: TrainConfig, ranks: "Ranks | None" = None, pool: CheckedPool | None = None
) -> RunInputs:
    """The pool (`check_pool`, unless the caller gives ``pool`` as it checked it), its initial model and
    tokenizer (checked against it), its learner temperature (`check_sampling`), the data plan and the
    fingerprints that identify pool and plan; ``ranks``: the processes of a torchrun job (None: this
    process alone)."""
    from ggpo_offline.train.distributed import SINGLE_PROCESS, check_split
    from ggpo_offline.train.rounds import is_recorded_rounds

    check_split(config.groups_per_batch, SINGLE_PROCESS if ranks is None else ranks)
    if is_recorded_rounds(config.pool):
        return _replay_inputs(config)
    if pool is None or pool.path != Path(config.pool):
        pool = check_pool(config.pool)
    model_dir, tokenizer, temperature = _model_and_sampling(config, pool)
    data = plan_data(config, pool.index, pool.fingerprint)
    source = rounds_source(config, pool)
    return RunInputs(pool, model_dir, tokenizer, temperature, data.plan, data.fingerprints, source)


def _model_and_sampling(config: TrainConfig, pool: CheckedPool) -> tuple[Path, object, float]:
    """The pool's initial model and tokenizer (checked against it) and its temperature (`check_sampling`)."""
    model_dir = initial_model_dir(config.model, pool.info.model.location)
    tokenizer = load_tokenizer(model_dir)
    check_tokenizer(config, pool.info, tokenizer)
    return (
        model_dir,
        tokenizer,
        check_sampling(pool.path, pool.info.sampling, config.allow_truncated_sampling),
    )


def rounds_source(config: TrainConfig, pool: CheckedPool) -> "PromptSource | None":
    """Where a --sync-every run samples its rounds after the first, checked to hold the prompts they need
    (None: it samples none)."""
    schedule, G = RoundSchedule.of(config), config.groups_per_batch
    if schedule.round_updates(0) == config.updates:
        return None
    if schedule.mixed:
        needed = schedule.round_updates(0) * G + schedule.pool_shares * G // config.off_policy_steps
        if len(pool.index.mixed_group_ids) < needed:
            raise UserError(
                f"--lag mixed takes {needed} mixed-reward groups of the pool (round 0's updates and the "
                f"shares of the versions before the first sample) but it has "
                f"{len(pool.index.mixed_group_ids)}; generate a larger pool or lower --groups-per-batch"
            )
    from ggpo_offline.generate.resample import prompt_source

    source = prompt_source(pool.source, config.sync_dataset)
    source.check_prompts_left(sum(schedule.sampled_groups(i, G) for i in range(1, len(schedule.starts))))
    return source


def _replay_inputs(config: TrainConfig) -> RunInputs:
    """A replay of a run's recorded rounds: its first round's pool and model, every round's minibatches."""
    from ggpo_offline.train.rounds import (
        recorded_plan,
        replayed_records,
        round_pool_path,
        rounds_fingerprints,
    )

    records = replayed_records(config)
    pool = check_pool(round_pool_path(Path(config.pool), records[0]))
    model_dir, tokenizer, temperature = _model_and_sampling(config, pool)
    plan = recorded_plan(records, config.updates)
    fingerprints = Fingerprints(*rounds_fingerprints(records, config.updates))
    return RunInputs(pool, model_dir, tokenizer, temperature, plan, fingerprints, recorded=records)


def score_pi0(
    config: TrainConfig,
    inputs: RunInputs,
    ranks: "Ranks | None" = None,
    pool: CheckedPool | None = None,
    model_dir: Path | None = None,
    beside: "ThreadPoolExecutor | None" = None,
) -> "Pi0Cache | ScoringCache":
    """The initial model's log-probs of the pool with the run's numerics: scored once per pool, model and
    numerics (a no-op when the cache exists) and shared by every run on the pool. Under torchrun rank 0
    scores while the others wait, then every rank opens the cache. ``pool`` and ``model_dir``: another
    pool (a round's) and another model (a checkpoint's) scored the same way. ``beside``: a thread of this
    one process that runs the forwards while the caller goes on (the model is loaded here, as loading
    changes torch's global state); the cache returned waits for it when read (`ScoringCache`)."""
    from ggpo_offline.train.distributed import SINGLE_PROCESS, device_of, doing, wait_for_main
    from ggpo_offline.train.pi0_cache import ScoringCache, score_pool, scoring_model

    ranks = SINGLE_PROCESS if ranks is None else ranks
    sharded, device = ranks.distributed and config.fsdp, device_of(ranks)
    pool = inputs.pool if pool is None else pool
    model_dir = inputs.model_dir if model_dir is None else model_dir

    def score(model: "torch.nn.Module | None" = None) -> "Pi0Cache":
        return score_pool(
            pool,
            model_dir,
            device,
            inputs.temperature,
            sharded=sharded,
            packed=not config.no_packing,
            model=model,
        )

    doing(f"scoring the log-probs of {pool.path.name}" if ranks.main else "waiting for the log-prob cache")
    if beside is not None:
        return ScoringCache(beside.submit(score, scoring_model(model_dir, device, sharded)))
    cache = score() if ranks.main else None
    wait_for_main(ranks)
    return score() if cache is None else cache  # the other ranks open what rank 0 wrote


def reference_pi0(config: TrainConfig, inputs: RunInputs, ranks: "Ranks") -> "Pi0Cache | None":
    """π0's log-probs (`score_pi0`) for every method with a reference; None for the others."""
    if "ref_logp" not in config.learner.needs:
        return None
    return score_pi0(config, inputs, ranks)
