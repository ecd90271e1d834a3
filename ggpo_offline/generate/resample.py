"""A pool's prompts and settings sampled again by a later policy: the pool of a training run's next round
(Algorithm 1, lines 3-8), and the process that samples every round of a run with one kept engine."""

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.remote import RemoteWorker
from ggpo_offline.core.settings import config_from, leaves
from ggpo_offline.core.stopwatch import Stopwatch
from ggpo_offline.generate.config import DEFAULT_ARITH_PROMPTS, GenerateConfig
from ggpo_offline.generate.engines.base import SamplingSettings
from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.pool.partial import stored_settings
from ggpo_offline.pool.source import PoolSource

ROUND_SETTINGS_LEFT_OUT = (
    "model", "policy_version", "num_prompts", "first_prompt", "keep_groups", "mixed_only", "out", "overwrite",
    "shard_index", "num_shards",
)  # fmt: skip
"""The settings a round chooses itself; every other one is the pool's."""
WINDOW_MARGIN = 1.25
"""A round first draws this many times the prompts its groups need at the last mixed rate (plus 2): the
engine samples the whole window in one batch, so every prompt past the last kept group is sampled for
nothing (at 2× + 8 a demo round drew 26 prompts for 9: 40 % of an N = 1 run's time); a window too small is
doubled (`sample_round`), and a round keeps the same groups whatever its window (each prompt's own seed)."""


@dataclass(frozen=True)
class PromptSource:
    """Where the rounds of a run draw their prompts from and how they sample them: the pool's dataset from
    the prompt after its last (or --sync-dataset from its first), with the pool's generation settings."""

    settings: dict
    """`GenerateConfig` settings by name, the round's own left out."""
    next_prompt: int
    """Dataset position of the first prompt no round has used yet."""
    mixed_rate: float
    """The pool's share of mixed-reward groups among the prompts it sampled."""

    @property
    def dataset(self) -> str:
        return self.settings.get("dataset", GenerateConfig.dataset)

    @property
    def engine(self) -> str:
        return self.settings.get("engine", GenerateConfig.engine)

    def round_config(
        self,
        model: Path,
        first_prompt: int,
        groups: int,
        out: Path,
        mixed_rate: float | None = None,
        version: int | None = None,
    ) -> GenerateConfig:
        """The pool of one round: ``model`` (the policy after ``version`` updates) samples from
        ``first_prompt`` on until ``groups`` mixed-reward groups are kept, from a window of prompts twice
        what they need at ``mixed_rate`` (the previous round's; default the pool's) — `sample_round` widens
        it when the policy's rate fell further."""
        window = self.window(groups, mixed_rate)
        return config_from(
            GenerateConfig,
            {
                **self.settings,
                "model": str(model),
                "policy_version": version,
                "first_prompt": first_prompt,
                "num_prompts": first_prompt + window,
                "keep_groups": groups,
                "mixed_only": True,
                "out": out,
            },
            where=f"the pool's recorded settings for {out}",
        )

    def window(self, groups: int, mixed_rate: float | None = None) -> int:
        """The prompts a round of ``groups`` mixed groups may draw at first (`round_config`)."""
        return math.ceil(WINDOW_MARGIN * self.prompts_needed(groups, mixed_rate)) + 2

    def prompts_needed(self, groups: int, mixed_rate: float | None = None) -> int:
        """The prompts ``groups`` mixed groups take at ``mixed_rate`` (default the pool's)."""
        return math.ceil(groups / (mixed_rate or self.mixed_rate))

    def prompts_sampled(self, groups: int) -> int:
        """How many prompts the engine samples for a round at the pool's mixed rate: its batches until the
        groups are kept and the one sampled ahead meanwhile, at most the window."""
        batch = self.settings.get("batch_prompts", GenerateConfig.batch_prompts)
        needed = self.prompts_needed(groups)
        return min(self.window(groups), (math.ceil(needed / batch) + 1) * batch)

    def check_prompts_left(self, groups: int) -> None:
        """Refused, with one line, when the dataset cannot hold the prompts that ``groups`` mixed groups
        need at the pool's mixed rate after ``next_prompt``."""
        from ggpo_offline.generate.datasets import load_dataset
        from ggpo_offline.generate.pipeline import dataset_kwargs

        needed = self.prompts_needed(groups)
        config = self.round_config(Path("-"), self.next_prompt, groups, Path("-"))
        try:
            wanted = dataclasses.replace(config, num_prompts=self.next_prompt + needed)
            found = len(load_dataset(wanted.dataset, **dataset_kwargs(wanted))[0])
        except UserError as error:
            found, why = None, f" ({error})"
        else:
            why = ""
        left = None if found is None else found - self.next_prompt
        if left is None or left < needed:
            has = "too few" if left is None else f"{max(left, 0)}"
            raise UserError(
                f"--sync-every: the rounds need about {needed} prompts ({groups} mixed-reward groups at the "
                f"pool's mixed rate {self.mixed_rate:.0%}) but {self.dataset} has {has} after prompt "
                f"{self.next_prompt}{why}; give more prompts with --sync-dataset, or fewer --updates"
            )


def prompt_source(pool: PoolSource, dataset: str | None) -> PromptSource:
    """The prompt source of ``pool``, or of ``dataset`` (--sync-dataset) with the pool's sampling settings;
    refused when the pool records no dataset to sample again (an import)."""
    info = pool.info
    recorded = info.config or {}
    sampling = {f.name: getattr(info.sampling, f.name) for f in dataclasses.fields(SamplingSettings)}
    sampling["learner_temperature"] = info.sampling.learner_temperature  # a round keeps the pool's mismatch
    settings = {
        **{k: v for k, v in recorded.items() if k in leaves(GenerateConfig)},
        **{k: v for k, v in sampling.items() if v is not None},
    }
    settings = {k: v for k, v in settings.items() if k not in ROUND_SETTINGS_LEFT_OUT}
    counts = info.counts
    rate = counts.mixed_groups / counts.prompts if counts.prompts and counts.mixed_groups else 1.0
    if dataset is not None and dataset != recorded.get("dataset"):
        return PromptSource({**settings, "dataset": dataset}, 0, rate)
    if "dataset" not in recorded:
        raise UserError(
            f"{pool.path} records no dataset to sample rounds from (dataset {info.dataset.spec}): give its "
            "prompts with --sync-dataset"
        )
    return PromptSource(settings, _next_prompt(pool, info, recorded), rate)


def _next_prompt(pool: PoolSource, info: PoolInfo, recorded: dict) -> int:
    """The dataset position after the pool's last prompt: after its last group when it stopped at
    --keep-groups, else after every prompt it loaded."""
    if recorded.get("keep_groups") is None:
        loaded = info.dataset.other.get("num_problems")
        return loaded if loaded is not None else recorded.get("num_prompts") or DEFAULT_ARITH_PROMPTS
    ids = [parquet.read(columns=["group_id"]).column("group_id") for parquet in pool.row_groups.parquets]
    return max(pc.max(column).as_py() for column in ids) + 1


class LocalSampler:
    """Samples a run's rounds in this process, with one engine kept across them (`KeptEngine`): the hf
    engine, torch in the trainer's threads with its random stream forked, needs no process of its own."""

    def __init__(self, _setup: None = None):
        from ggpo_offline.generate.pipeline import KeptEngine

        self.engine = KeptEngine()

    def sample(self, config: GenerateConfig) -> "SampledRound":
        """The pool of ``config`` written (`sample_round`)."""
        return sample_round(config, self.engine)

    def warm(self, config: GenerateConfig) -> None:
        """Nothing: in the asking process an engine started early would only start sooner, not alongside."""

    def answer(self, kind: str, config: GenerateConfig) -> "SampledRound | None":
        if kind == "warm":
            return self.engine.warm(config)
        return self.sample(config)

    def close(self) -> None:
        self.engine.close()


class RemoteSampler:
    """A `LocalSampler` in a process of its own (`RemoteWorker`): vLLM's engine binds the threads of the
    process it runs in and joins a torchrun job's process group, so the trainer's stay its own."""

    def __init__(self, timeout_s: float):
        self._worker = RemoteWorker("the sampling engine", LocalSampler, None, timeout_s)

    def sample(self, config: GenerateConfig) -> "SampledRound":
        """The pool of ``config`` written (`sample_round`)."""
        return self._worker.ask(("generate", config), f"sampling {Path(config.out).name}")

    def warm(self, config: GenerateConfig) -> None:
        """Start the engine and reward workers of ``config``'s pool (`KeptEngine.warm`) while this process
        goes on; the next request waits for them."""
        self._worker.send(("warm", config), "starting its engine")

    def close(self) -> None:
        self._worker.close()


def round_sampler(engine: str, timeout_s: float) -> "LocalSampler | RemoteSampler":
    """Where a run's rounds are sampled: in this process for the hf engine, in one of their own for vLLM."""
    return LocalSampler() if engine == "hf" else RemoteSampler(timeout_s)


@dataclass(frozen=True)
class SampledRound:
    """A round's pool, written, and the wall seconds spent on it "sampling", "scoring" (waiting for rewards)
    and "writing" (`generate_pool`'s stopwatch)."""

    path: Path
    seconds: dict[str, float]


def sample_round(config: GenerateConfig, engine) -> SampledRound:
    """`generate_pool` of a round (its own resume state kept until the pool is in place), its prompt window
    doubled while every prompt of it was sampled and too few groups were mixed — a policy that learns
    leaves fewer mixed groups per prompt — until the dataset has no more prompts. The widening depends only
    on the round's settings and samples, so a rerun widens the same way."""
    from ggpo_offline.generate.pipeline import TooFewGroups, generate_pool

    stopwatch = Stopwatch()
    widened = (stored_settings(config.out) or {}).get("dataset.limit") or 0
    if widened > config.num_prompts:  # a kill stopped a widened window: its stored batches are resumed
        config = dataclasses.replace(config, num_prompts=widened)
    while True:
        try:
            return SampledRound(generate_pool(config, engine=engine, stopwatch=stopwatch), stopwatch.seconds)
        except TooFewGroups as error:
            if error.dataset_prompts < config.num_prompts:
                raise
            window = config.num_prompts - config.first_prompt
            config = dataclasses.replace(config, num_prompts=config.first_prompt + 2 * window)
