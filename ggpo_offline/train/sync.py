"""Entering each round of a --sync-every run, or of a replay of its rounds: the round's pool sampled by the
checkpoint that starts it (or read), its minibatches, its π_ref and behavior log-probs, and its mismatch
measured on the sampling policy before any update on it."""

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.assemble import Share, assemble_pool
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.train.config import Timeouts, TrainConfig
from ggpo_offline.train.distributed import Ranks, doing, wait_for_main
from ggpo_offline.train.metric_names import ROUND_INDEX
from ggpo_offline.train.pool_index import check_pool, index_pool, plan_minibatches
from ggpo_offline.train.profile import RunProfile
from ggpo_offline.train.rounds import (
    Round,
    RoundRecord,
    RoundSchedule,
    first_record,
    read_records,
    round_pool_path,
    rounds_fingerprints,
    rounds_folder,
    sampled_record,
    write_records,
)
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.run_inputs import Fingerprints, RunInputs, score_pi0
from ggpo_offline.train.update_metrics import RoundMismatch

if TYPE_CHECKING:
    from ggpo_offline.generate.config import GenerateConfig
    from ggpo_offline.generate.resample import LocalSampler, RemoteSampler, SampledRound
    from ggpo_offline.train.pi0_cache import Pi0Cache, ScoringCache


class RunRounds:
    """The rounds of one run: which update starts one, and what entering it sets (`enter`). A run given a
    pool samples its rounds (rank 0, in a process of its own) and records them in its rounds/ folder; a
    replay reads the recorded ones."""

    def __init__(
        self,
        config: TrainConfig,
        inputs: RunInputs,
        folder: RunFolder,
        ranks: Ranks,
        timeouts: Timeouts,
        profile: RunProfile,
    ):
        self.config, self.inputs, self.folder, self.ranks = config, inputs, folder, ranks
        self.timeouts, self.profile = timeouts, profile
        self.replay = inputs.recorded is not None
        self.dir = Path(config.pool) if self.replay else rounds_folder(folder.path)
        self.records: list[RoundRecord] = inputs.recorded if self.replay else read_records(self.dir)
        if not self.records:
            self.records = [first_record(inputs.pool, inputs.plan, inputs.prompt_source)]
            if ranks.main:
                write_records(self.dir, self.records)
        self.schedule = RoundSchedule.of(config)
        self.starts = [r.start for r in self.records] if self.replay else self.schedule.starts
        sampled = range(1, 1 if self.replay else len(self.starts))  # a replay samples none
        self.samplers = {self.schedule.version(index) for index in sampled}
        self._sampler: LocalSampler | RemoteSampler | None = None
        self._beside: ThreadPoolExecutor | None = None
        self._warm()

    # -- the schedule -------------------------------------------------------------------------------
    def starts_round(self, update: int) -> bool:
        return update in self.starts

    def checkpoint_due(self, done: int) -> bool:
        """A checkpoint after ``done`` updates that a later round reads: its sampler, or the π_ref that a
        refresh froze (its log-probs of the later rounds' responses are scored from it)."""
        t_ref = self.config.ref_refresh
        refresh = t_ref is not None and "ref_logp" in self.config.learner.needs and done % t_ref == 0
        return done < self.config.updates and (done in self.samplers or (refresh and done < self.starts[-1]))

    def fingerprints(self) -> Fingerprints:
        """The pools and data order of every round trained: what a replay of them reports too."""
        return Fingerprints(*rounds_fingerprints(self.records, self.config.updates))

    # -- entering a round ---------------------------------------------------------------------------
    def enter(self, update: int, trainer, minibatches) -> tuple[dict[str, float], RoundMismatch | None]:
        """Point ``minibatches`` and ``trainer`` at the round holding ``update`` (sampling it first when it
        is not recorded yet); at its first update, the round's metrics (`round_metrics`), or for a round of
        one update the `RoundMismatch` its step fills: that step's forward is the round's, on the same
        policy (a second forward cost an N = 1 run 7 % of its time)."""
        index = max(i for i, start in enumerate(self.starts) if start <= update)
        round_ = self._round(index)
        self.entered, self.versions = round_, group_versions(round_)
        behavior = self._behavior(round_)
        minibatches.enter(round_.pool, round_.plan, round_.start, behavior)
        if index > 0 and trainer.needs_ref:
            trainer.reference = self._round_reference(update, round_)
        if update != round_.start:
            return {}, None
        if minibatches.end - round_.start == 1:
            return {ROUND_INDEX: float(index)}, RoundMismatch(self.ranks)
        with self.profile.phase("round_diagnostics", update):
            return {ROUND_INDEX: float(index), **round_metrics(trainer, minibatches)}, None

    def ages(self, update: int) -> dict[int, int]:
        """Group id → its age at ``update`` (updates trained since its sampler), for the groups of
        ``update``'s minibatch in the round entered."""
        row = self.entered.plan[update - self.entered.start].tolist()
        return {group: update - self.versions[group] for group in row}

    def mixes_ages(self) -> bool:
        """Whether the round entered holds groups of several samplers (--lag mixed)."""
        return len(set(self.versions.values())) > 1

    def _round(self, index: int) -> Round:
        if index < len(self.records):
            record = self.records[index]
            return Round(record, check_pool(round_pool_path(self.dir, record)))
        if self.replay or index != len(self.records):
            raise UserError(f"{self.dir}: round {index} is not recorded")  # a rounds.json edited by hand
        previous, start, version = self.records[-1], self.starts[index], self.schedule.version(index)
        sampler = self.folder.checkpoint(version)
        path, sample = self.dir / f"round-{index:04d}.parquet", self._sample_path(index)
        # A pool written before a kill is complete (each is renamed into place): it is kept.
        if self.ranks.main and not path.is_file():
            if not sample.is_file():
                doing(f"sampling round {index} with the checkpoint of update {version}")
                with self.profile.phase("round_engine", start) as parts:
                    sampled = self._sample(index, previous.next_prompt, sampler, sample)
                    parts.update({f"round_{name}": seconds for name, seconds in sampled.seconds.items()})
            if self.schedule.mixed:
                with self.profile.phase("round_assemble", start):
                    self._assemble(start, path)
        wait_for_main(self.ranks)
        with self.profile.phase("round_index", start):
            pool = check_pool(path)
        sampled_ids = (index_pool(sample) if self.schedule.mixed else pool.index).mixed_group_ids
        next_prompt = int(sampled_ids.max()) + 1  # a sample ends at its last kept group
        record = sampled_record(self.config, index, pool, sampler, next_prompt)
        self.records.append(record)
        if self.ranks.main:
            write_records(self.dir, self.records)
        return Round(record, pool)

    def _sample_path(self, index: int) -> Path:
        """Where round ``index``'s sampler writes: the round's pool, or with --lag mixed the pool of its
        newest version, whose shares the round and the next K − 1 assemble."""
        if self.schedule.mixed:
            return self.dir / f"sampled-{self.schedule.version(index):04d}.parquet"
        return self.dir / f"round-{index:04d}.parquet"

    def _sample(self, index: int, first_prompt: int, sampler: Path, path: Path) -> "SampledRound":
        return self._round_sampler().sample(self._round_config(index, first_prompt, sampler, path))

    def _round_config(self, index: int, first_prompt: int, sampler: Path, path: Path) -> "GenerateConfig":
        groups = self.schedule.sampled_groups(index, self.config.groups_per_batch)
        return self.inputs.prompt_source.round_config(
            sampler, first_prompt, groups, path, self._mixed_rate(), self.schedule.version(index)
        )

    def _round_sampler(self) -> "LocalSampler | RemoteSampler":
        from ggpo_offline.generate.resample import round_sampler

        if self._sampler is None:
            self._sampler = round_sampler(self.inputs.prompt_source.engine, self.timeouts.solo)
        return self._sampler

    def _warm(self) -> None:
        """Start the engine of the next round to sample while the updates before it run (vLLM's start took
        an N = 1 run 11 s of its 128 here): on π0's weights, at the dtype that the learner's float32
        checkpoints give it, which the sampler's weights then replace in place, as every later round's."""
        index = len(self.records)
        if self.replay or index >= len(self.starts) or not self.ranks.main:
            return
        config = self._round_config(index, self.records[-1].next_prompt, self.inputs.model_dir, self.dir)
        if config.dtype == "auto":
            config = dataclasses.replace(config, dtype="float32")
        self._round_sampler().warm(config)

    def _assemble(self, update: int, out: Path) -> None:
        """--lag mixed: ``update``'s round from one G/K share of each version 1..K updates before it
        (`RoundSchedule.shares`; the given pool for versions ≤ 0), each share a seeded part of its sample."""
        seed, share = self.config.seed, self.config.groups_per_batch // self.config.off_policy_steps
        round_0 = self.schedule.round_updates(0) * self.config.groups_per_batch
        pool_plan = plan_minibatches(self.inputs.index, seed, 1, round_0 + self.schedule.pool_shares * share)
        shares = []
        for version, part in self.schedule.shares(update):
            if version == 0:  # the pool's groups after round 0's, in its plan's order
                groups = pool_plan[0, round_0 + part * share :][:share]
                shares.append(Share(self.inputs.pool.path, groups.tolist(), 0))
                continue
            sample = self.dir / f"sampled-{version:04d}.parquet"
            plan = plan_minibatches(index_pool(sample), seed, self.schedule.sampled_shares(version), share)
            shares.append(Share(sample, plan[part].tolist(), version))
        assemble_pool(shares, read_pool_info(self.dir / f"sampled-{update - 1:04d}.parquet"), out)

    def _mixed_rate(self) -> float | None:
        """The last sample's mixed groups per prompt sampled (None before any: the pool's)."""
        if len(self.records) < 2:
            return None
        counts = read_pool_info(self._sample_path(len(self.records) - 1)).counts
        return counts.mixed_groups / counts.prompts

    def _round_reference(self, update: int, round_: Round) -> "Pi0Cache | ScoringCache":
        """π_ref's log-probs of the round's responses (`score_pi0`). A run of one process on one thread has
        them scored in a thread of its own while its update's forward runs (the round's sampler, which
        used both cores, is idle then), and the loss waits for them: the wait is the step's
        ``round_reference``; a forward on each core gives each its single-thread numbers."""
        reference = self._reference(update)
        if self.ranks.distributed or torch.get_num_threads() != 1:
            with self.profile.phase("round_reference", update):
                return score_pi0(self.config, self.inputs, self.ranks, round_.pool, reference)
        if self._beside is None:
            self._beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="round-reference")
        return score_pi0(self.config, self.inputs, self.ranks, round_.pool, reference, beside=self._beside)

    def _reference(self, update: int) -> Path:
        """π_ref's weights at ``update``: the initial model until the first refresh, then the checkpoint of
        the last one."""
        t_ref = self.config.ref_refresh
        last = 0 if t_ref is None else (update // t_ref) * t_ref
        return self.inputs.model_dir if last == 0 else self.folder.checkpoint(last)

    def _behavior(self, round_: Round):
        """--behavior-logprobs learner: the learner's log-probs of the round on the checkpoint that sampled
        it, in the engine's place (None: the engine's, as the pool stores them)."""
        if self.config.behavior_logprobs != "learner":
            return None
        sampler = (
            self.inputs.model_dir if round_.record.sampled_by is None else Path(round_.record.sampled_by)
        )
        with self.profile.phase("round_rescore", round_.start):
            return score_pi0(self.config, self.inputs, self.ranks, round_.pool, sampler)

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
        if self._beside is not None:
            self._beside.shutdown(cancel_futures=True)


def group_versions(round_: Round) -> dict[int, int]:
    """Group id → the policy version (updates trained) that sampled it: 0 in round 0, the run's given pool;
    else as the round's pool records it (per group for --lag mixed, else the pool's version), or for a
    round recorded before pools did, its start (such runs were synchronous)."""
    model, groups = round_.pool.info.model, round_.pool.index.mixed_group_ids.tolist()
    if round_.record.index > 0 and model.group_versions is not None:
        return {int(group): version for group, version in model.group_versions.items()}
    version = model.policy_version if model.policy_version is not None else round_.start
    return dict.fromkeys(groups, 0 if round_.record.index == 0 else version)


@torch.no_grad()
def round_metrics(trainer, minibatches) -> dict[str, float]:
    """The round's mismatch (`RoundMismatch`) under the current policy, the one that sampled it unless
    --off-policy-steps put it K updates behind: a forward of every minibatch of the round."""
    mismatch = RoundMismatch(trainer.ranks)
    trainer.policy.eval()
    try:
        for update in range(minibatches.start, minibatches.end):
            for micro in minibatches[update].split(trainer.config.micro_batch_size):
                logp, entropy = trainer.policy(
                    micro, with_entropy=True, forward_tokens=trainer.forward_tokens
                )
                mismatch.add(logp, entropy, micro.behavior_logp, micro.mask)
    finally:
        trainer.policy.train()
    return mismatch.metrics()
