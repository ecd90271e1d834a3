"""The replay trainer: one loop over the planned updates (evaluate, fetch the minibatch, log-probs → loss →
backward → step, record, checkpoint), each minibatch used once."""

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import load_tokenizer
from ggpo_offline.core.one_writer import one_writer
from ggpo_offline.evaluate.eval_report import EvalReport
from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.train.checkpoint import RankState, RunState, load_state, resume_point, save_checkpoint
from ggpo_offline.train.config import DEFAULT_TIMEOUTS, Timeouts, TrainConfig
from ggpo_offline.train.distributed import (
    SINGLE_PROCESS,
    Ranks,
    all_sum,
    device_of,
    doing,
    full_state_dict,
    gradient_sync,
    init_ranks,
    rank_groups,
    scalar,
    stop_when_asked,
    wrap,
)
from ggpo_offline.train.evaluation import CheckpointEvaluations
from ggpo_offline.train.logprobs import ResponseLogprobs
from ggpo_offline.train.loss_inputs import LossInputs
from ggpo_offline.train.losses import LossOutput, NonFiniteCoefficient
from ggpo_offline.train.metric_names import FILTERED_FRAC
from ggpo_offline.train.minibatch import Minibatch, MinibatchReader
from ggpo_offline.train.pi0_cache import Pi0Cache, ScoringCache
from ggpo_offline.train.probe import DriftProbe, drift_probe
from ggpo_offline.train.profile import RunProfile
from ggpo_offline.train.run_inputs import (
    CheckedPool,
    Fingerprints,
    RunInputs,
    read_inputs,
    reference_pi0,
    score_pi0,
)
from ggpo_offline.train.run_tracking import FLUSH_EVERY, Run, failures_explained
from ggpo_offline.train.sync import RunRounds
from ggpo_offline.train.update_metrics import EssBlock, RoundMismatch, StepDiagnostics, age_metrics


@dataclass(frozen=True)
class TrainResult:
    """Where a finished run lives and how it can be found again."""

    run_dir: Path
    final_model: Path
    run_id: str | None
    fingerprints: Fingerprints
    metrics: list[dict]


class PlannedMinibatches:
    """This rank's share of each planned update's minibatch, read from the pool when asked for: of the
    round being trained (`enter`; an offline run is one round)."""

    def __init__(self, inputs: RunInputs, ranks: Ranks):
        self.ranks, self.pad_id = ranks, inputs.tokenizer.pad_token_id or 0
        self.enter(inputs.pool, inputs.plan, 0)  # a run with rounds enters its first at its first update

    def enter(
        self, pool: CheckedPool, plan: np.ndarray, start: int, behavior: Pi0Cache | None = None
    ) -> None:
        """Serve updates ``start`` .. ``start + len(plan) - 1`` from ``pool``; ``behavior``: log-probs that
        take the pool's behavior log-probs' place (--behavior-logprobs learner)."""
        self.reader = MinibatchReader(pool.source, pool.index, pad_id=self.pad_id)
        self.plan, self.start, self.behavior = plan, start, behavior

    @property
    def end(self) -> int:
        """The update after the round's last."""
        return self.start + len(self.plan)

    def __getitem__(self, update: int) -> Minibatch:
        batch = self.reader.read(rank_groups(self.plan[update - self.start].tolist(), self.ranks))
        if self.behavior is not None:
            batch.behavior_logp = self.behavior.logprobs(batch)
        return batch


class Trainer:
    """Owns the policy, the optimizer and the counters of one run (of this rank, when distributed)."""

    def __init__(
        self,
        config: TrainConfig,
        weights: Path,
        pi0: Pi0Cache | None,
        ranks: Ranks = SINGLE_PROCESS,
        temperature: float = 1.0,
        profile: RunProfile | None = None,
    ):
        """``weights``: the initial model or the checkpoint being resumed; ``pi0`` serves the initial model's
        log-probs (needed by every method with a reference); ``temperature``: the pool's learner
        temperature, which every log-prob of the run uses (`learner_temperature`); ``profile`` times each
        update's phases."""
        from transformers import AutoModelForCausalLM

        self.config = config
        self.ranks = ranks
        self.device = device_of(ranks)
        self.profile = RunProfile() if profile is None else profile
        with self.profile.phase("model"):
            self.tokenizer = load_tokenizer(weights)
            self.model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32)
            self.model.to(self.device)
        # π_θ: the model's response log-probs, wrapped by DDP or FSDP2 under torchrun
        self.policy = wrap(
            ResponseLogprobs(self.model, temperature, packed=not config.no_packing), ranks, config.fsdp
        )
        self.policy.train()
        self.sharded = ranks.distributed and config.fsdp
        # FSDP2 gathers a layer's weights at every decoder call, so all ranks must make the same calls:
        # one decoder forward per micro-batch instead of length-sorted forwards.
        self.forward_tokens = None if self.sharded else config.forward_tokens
        self.learner = config.learner  # the registry's record of the method: its loss and what it needs
        self.needs_ref = "ref_logp" in self.learner.needs
        self.needs_old = "old_logp" in self.learner.needs
        self.reference = pi0  # π_ref's log-probs where no refresh window covers an update (`RunRounds`)
        # π_ref and π_old are constants between refreshes: no second copy of the weights is kept, their
        # log-probs for the minibatches they will serve are computed at the refresh (update -> one tensor
        # per micro-batch). Until its first refresh π_ref is π0, served by the π0 cache.
        self.ref_window: dict[int, list[torch.Tensor]] = {}
        self.old_window: dict[int, list[torch.Tensor]] = {}
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.loss_kwargs = self.learner.loss_kwargs(config)
        self.update = 0
        self.ess_block = EssBlock(config.ess_block)
        self.probe: DriftProbe | None = None  # `attach`

    # -- state --------------------------------------------------------------------------------------
    def state(self, run_id: str | None) -> tuple[RunState, RankState]:
        """(the run's state, written by rank 0; this rank's own: its anchor windows, and its optimizer
        shard under FSDP2)."""
        optimizer = self.optimizer.state_dict()
        run_state = RunState(
            update=self.update,
            optimizer=None if self.sharded else optimizer,
            ess_log_weights=self.ess_block.log_weights,
            torch_rng=torch.get_rng_state(),
            run_id=run_id,
            config=self.config.to_dict(),
            world=self.ranks.world,
        )
        rank_state = RankState(
            ref_window=self.ref_window,
            old_window=self.old_window,
            optimizer=optimizer if self.sharded else None,
            probe_pi0=None if self.probe is None else self.probe.pi0,
        )
        return run_state, rank_state

    def restore(self, checkpoint: Path) -> str | None:
        """Continue from ``checkpoint``, whose weights this trainer was built from; returns its MLflow run."""
        run_state, rank_state = load_state(checkpoint, self.ranks.rank)
        self.optimizer.load_state_dict(rank_state.optimizer if self.sharded else run_state.optimizer)
        self.ref_window, self.old_window = rank_state.ref_window, rank_state.old_window
        if self.probe is not None:  # a checkpoint written before the probe existed has no π0 for it
            self.probe.pi0 = rank_state.probe_pi0
            self.probe = None if self.probe.pi0 is None else self.probe
        self.ess_block.log_weights = run_state.ess_log_weights
        torch.set_rng_state(run_state.torch_rng)
        self.update = run_state.update
        return run_state.run_id

    def save(self, path: Path, run_id: str | None, resumable: bool = True) -> Path:
        """A Hugging Face folder of the full weights (+ resume state); every rank takes part."""
        weights = full_state_dict(self.policy)  # FSDP2: gathered on rank 0
        run_state, rank_state = self.state(run_id) if resumable else (None, None)
        return save_checkpoint(path, self.model, self.tokenizer, run_state, rank_state, self.ranks, weights)

    # -- one update ---------------------------------------------------------------------------------
    def refresh_anchors(self, minibatches: PlannedMinibatches) -> None:
        """π_ref ← π_θ every T_ref updates (global counter); π_old ← π_θ at each TIS block start and where
        a round starts (the learner's copy of the policy that sampled it, Algorithm 1 line 3).

        A refresh runs the current weights without gradients over the ``minibatches`` the new anchor will
        serve (the next T_ref updates, or the TIS block) within the round, exactly what a frozen copy would
        compute then; a later round's π_ref log-probs are scored from the refresh's checkpoint (`RunRounds`).
        """
        t_ref, block, end = self.config.ref_refresh, self.config.tis_block, minibatches.end
        if self.needs_ref and t_ref and self.update > 0 and self.update % t_ref == 0:
            self.ref_window = self._anchor_pass(
                minibatches, range(self.update, min(self.update + t_ref, end))
            )
        if self.needs_old and (self.update % block == 0 or self.update == minibatches.start):
            block_end = (self.update // block + 1) * block
            self.old_window = self._anchor_pass(minibatches, range(self.update, min(block_end, end)))

    @torch.no_grad()
    def _anchor_pass(self, minibatches: PlannedMinibatches, updates: range) -> dict[int, list[torch.Tensor]]:
        self.policy.eval()
        try:
            with self.profile.phase("anchors", self.update):
                return {
                    update: [
                        self.policy(micro, forward_tokens=self.forward_tokens)[0].cpu()
                        for micro in minibatches[update].split(self.config.micro_batch_size)
                    ]
                    for update in updates
                }
        finally:
            self.policy.train()

    def attach(self, probe: DriftProbe | None) -> None:
        """Measure the drift from π0 on ``probe`` (before `restore`, which gives it π0's log-probs back);
        every rank measures it at each evaluated checkpoint (`drift`)."""
        self.probe = probe

    def drift(self) -> dict[str, float]:
        """The policy's drift from π0 on the probe (`DriftProbe`; {} without one): every rank calls it."""
        if self.probe is None:
            return {}
        with self.profile.phase("probe", self.update):
            return self.probe.measure(self.policy, self.forward_tokens)

    def step(
        self,
        batch: Minibatch,
        ages: dict[int, int] | None = None,
        round_mismatch: RoundMismatch | None = None,
    ) -> dict[str, float]:
        """One optimizer update on (this rank's share of) one minibatch: log-probs → loss → backward per
        micro-batch, then the step; returns the minibatch's metrics, reduced over ranks and computed before
        the step (``ages``: group id → age, for a minibatch of several ages: its K3 by age too;
        ``round_mismatch``: filled from the same forward, for a round of this one minibatch). The anchors
        this update reads must be fresh (`refresh_anchors`)."""
        micros = batch.split(self.config.micro_batch_size)
        token_count = all_sum(batch.mask.sum(), self.ranks).to(self.device)
        constants = self._update_constants()
        counts = self.learner.prepare(
            MinibatchOnDevice(micros, token_count, constants, self._policy_logp, self._total)
        )
        responses = batch.num_responses * self.ranks.world
        diagnostics = StepDiagnostics(
            counts.token_count, responses, self.needs_ref, self.ranks, ages, round_mismatch
        )
        self.optimizer.zero_grad(set_to_none=True)
        with self.profile.phase("forward_backward", self.update) as waited:
            for position, micro in enumerate(micros):
                mask, behavior = micro.mask.to(self.device), micro.behavior_logp.to(self.device)
                with gradient_sync(self.policy, enabled=position == len(micros) - 1):
                    logp, entropy = self.policy(micro, with_entropy=True, forward_tokens=self.forward_tokens)
                    if isinstance(self.reference, ScoringCache):  # scored beside the forward: read when ready
                        self.reference, waited["round_reference"] = self.reference.resolved()
                    inputs = LossInputs.of(micro, logp, mask, counts, constants.of(micro, position))
                    result = self._loss(inputs)
                    # DDP and FSDP2 average gradients over ranks; a loss normalized by the global T_tok wants
                    # their sum, the 1-process gradient.
                    (result.loss * self.ranks.world).backward()
                ref_logp = inputs.ref_logp
                diagnostics.add(
                    micro, logp, entropy, mask=mask, behavior_logp=behavior, ref_logp=ref_logp, loss=result
                )
        with self.profile.phase("optimizer", self.update):
            grad_norm = scalar(
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.grad_clip)
            )
            self._check_finite(diagnostics.reduce_sums()["loss"], grad_norm, counts.kept_token_count)
            self.optimizer.step()
        metrics = diagnostics.metrics(batch, grad_norm, self.config.method, self.ess_block)
        self.ref_window.pop(self.update, None)  # served; the checkpoint keeps only what is still due
        self.old_window.pop(self.update, None)
        self.update += 1
        return metrics

    def _loss(self, inputs: LossInputs) -> LossOutput:
        """The learner's loss on one micro-batch, normalized by the minibatch's counts (`Learner.prepare`)."""
        try:
            return self.learner.loss_on(inputs, self.loss_kwargs)
        except NonFiniteCoefficient as error:
            raise UserError(f"{error} at update {self.update}; stopped before writing a checkpoint") from None

    def _check_finite(self, loss: float, grad_norm: float, kept_tokens: Tensor | None) -> None:
        """Stop before the step (and so before any checkpoint) when the loss or the gradient is not finite;
        a minibatch whose rejections kept no token has loss 0/0 = NaN and a zero gradient, and is stepped
        on as verl steps on it (its metric correction/none_kept says so)."""
        nothing_kept = kept_tokens is not None and scalar(kept_tokens) == 0
        if not ((math.isfinite(loss) or nothing_kept) and math.isfinite(grad_norm)):
            raise UserError(
                f"non-finite loss or gradient at update {self.update} "
                f"(loss {loss}, grad norm {grad_norm}); stopped before writing a checkpoint"
            )

    def _update_constants(self) -> "UpdateConstants":
        """Where this update's constant log-probs come from: the refresh windows that cover it, else π_ref."""
        ref_window = self.ref_window.get(self.update) if self.needs_ref else None
        old_window = self.old_window[self.update] if self.needs_old else None
        return UpdateConstants(self.learner.needs, self.device, self.reference, ref_window, old_window)

    @torch.no_grad()
    def _policy_logp(self, micro: Minibatch) -> Tensor:
        # The loss's own forward: with the entropy, the log-probs' normaliser differs in the last bits, and a
        # count read on π_θ must see the log-probs the loss reads.
        return self.policy(micro, with_entropy=True, forward_tokens=self.forward_tokens)[0]

    def _total(self, count: Tensor) -> Tensor:
        return all_sum(count, self.ranks).to(self.device)


@dataclass(frozen=True)
class UpdateConstants:
    """One update's constant log-probs, micro-batch by micro-batch, as its learner needs them: log μ from the
    pool, log π_ref (this update's refresh window, else the reference: π0's cache or the refreshed model)
    and log π_old (its TIS block's window)."""

    needs: tuple[str, ...]
    device: torch.device
    reference: object
    ref_window: list[Tensor] | None
    old_window: list[Tensor] | None

    def of(self, micro: Minibatch, position: int) -> dict[str, Tensor]:
        constants = {"behavior_logp": micro.behavior_logp}
        if "ref_logp" in self.needs:
            window = self.ref_window
            constants["ref_logp"] = self.reference.logprobs(micro) if window is None else window[position]
        if "old_logp" in self.needs:
            constants["old_logp"] = self.old_window[position]
        return {k: v.to(self.device) for k, v in constants.items() if k in self.needs}


@dataclass(frozen=True)
class MinibatchOnDevice:
    """One update's minibatch as its learner's `Learner.prepare` reads it (`MinibatchSource`): each
    micro-batch's mask and constant log-probs on the training device, π_θ's log-probs without gradient
    (``policy_logp``), and a count summed over the ranks (``total``)."""

    micros: list[Minibatch]
    token_count: Tensor
    constants_of: UpdateConstants
    policy_logp_of: Callable[[Minibatch], Tensor]
    total: Callable[[Tensor], Tensor]

    @property
    def micro_batches(self) -> int:
        return len(self.micros)

    def mask(self, position: int) -> Tensor:
        return self.micros[position].mask.to(self.constants_of.device)

    def constants(self, position: int) -> dict[str, Tensor]:
        return self.constants_of.of(self.micros[position], position)

    def policy_logp(self, position: int) -> Tensor:
        return self.policy_logp_of(self.micros[position])


def _use_threads(threads: int | None) -> None:
    """--threads for torch. vLLM's CPU engine, once started in this process (the evaluation), binds its
    threads to every core and turns torch.set_num_threads into a no-op; told not to bind, it keeps ours."""
    if threads is not None:
        torch.set_num_threads(threads)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    on_update: Callable[[int, dict], None] | None = None,
    on_eval: Callable[[int, EvalReport], None] | None = None,
    evaluator: Evaluator | None = None,
    parent_run_id: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    pool: CheckedPool | None = None,
) -> TrainResult:
    """Train ``config.method`` on the pool's planned minibatches; see TrainConfig for every setting.

    With an ``eval_every`` the policy is evaluated at update 0, every N updates and at the end, each
    time from a checkpoint saved at that update (`CheckpointEvaluations`; ``evaluator`` shares one started
    engine between runs). ``parent_run_id`` nests the MLflow run; ``pool``: the pool as a caller already
    checked it (`check_pool`; compare reads it once for all its runs). The run folder, resume and metric
    flushing belong to `Run`.

    Under torchrun every process calls this: each trains its contiguous share of every minibatch's groups
    (DDP, or FSDP2 with ``config.fsdp``); rank 0 alone evaluates (in a process of its own), talks to MLflow
    and writes files. No wait is unbounded (``timeouts``): a process that gives up raises a `JobFailure`.
    """
    from ggpo_offline.core import tracking

    ranks = init_ranks(timeouts)
    stop_when_asked(ranks)
    profile = RunProfile.of_first_run()  # where the time goes, into the run's profile.jsonl
    with failures_explained(config.run_dir, ranks, timeouts):
        # Set-up: every input is checked before the run folder is touched.
        doing("reading the pool")
        with profile.phase("inputs"):
            inputs = read_inputs(config, ranks, pool)
        evaluations = CheckpointEvaluations(
            config, inputs.model_dir, ranks, evaluator, on_eval, timeouts, profile
        )
        with one_writer(config.run_dir, ranks.main):
            with evaluations:
                if not config.no_tracking and ranks.main:
                    tracking.check_tracking_reachable(config.tracking_uri or tracking.default_tracking_uri())
                run = Run(config, ranks, resume=resume, overwrite=overwrite, profile=profile)
                trainer, minibatches = _started(config, run, inputs, ranks, resume, parent_run_id, profile)
                with tracking.ending(run.tracker), _rounds(config, inputs, run, ranks, timeouts) as rounds:
                    final = _updates(trainer, minibatches, evaluations, run, inputs, rounds, on_update)
                    fingerprints = inputs.fingerprints if rounds is None else rounds.fingerprints()
                selected = evaluations.test(run.folder)
            run.finish(final, fingerprints, selected)
    return TrainResult(run.folder.path, final, run.run_id, fingerprints, run.history)


@contextmanager
def _rounds(
    config: TrainConfig, inputs: RunInputs, run: Run, ranks: Ranks, timeouts: Timeouts
) -> Iterator[RunRounds | None]:
    """The run's rounds (`RunRounds`): with --sync-every, or replaying a run's rounds; None offline."""
    if config.sync_every is None and inputs.recorded is None:
        yield None
        return
    rounds = RunRounds(config, inputs, run.folder, ranks, timeouts, run.profile)
    try:
        yield rounds
    finally:
        rounds.close()


def _started(
    config: TrainConfig,
    run: Run,
    inputs: RunInputs,
    ranks: Ranks,
    resume: bool,
    parent_run_id: str | None,
    profile: RunProfile,
) -> tuple[Trainer, PlannedMinibatches]:
    """The trainer at the run's first update, from the initial model or the checkpoint --resume continues,
    and the run started at that update."""
    resumed = resume_point(run.folder, config, ranks) if resume else None
    _use_threads(config.threads)
    with profile.phase("pi0"):
        pi0 = reference_pi0(config, inputs, ranks)
    minibatches = PlannedMinibatches(inputs, ranks)
    torch.manual_seed(config.seed)
    trainer = Trainer(config, resumed or inputs.model_dir, pi0, ranks, inputs.temperature, profile)
    trainer.attach(drift_probe(config, minibatches.reader, ranks))
    run_id = trainer.restore(resumed) if resumed is not None else None
    run.start(trainer.update, run_id, parent_run_id, inputs.fingerprints, inputs.tracking_params)
    return trainer, minibatches


def _updates(
    trainer: Trainer,
    minibatches: PlannedMinibatches,
    evaluations: CheckpointEvaluations,
    run: Run,
    inputs: RunInputs,
    rounds: RunRounds | None,
    on_update: Callable[[int, dict], None] | None,
) -> Path:
    """Every update left, each evaluated when due, trained (on the round it belongs to, entered where it
    starts), recorded and checkpointed when due; then the last evaluation and the final model, whose folder
    this returns."""
    config, profile, first = trainer.config, trainer.profile, trainer.update
    for update in range(first, config.updates):
        evaluation = evaluations.at(update, run.folder, trainer.drift)  # of the checkpoint before the update
        entered, round_mismatch = {}, None
        if rounds is not None and (update == first or rounds.starts_round(update)):
            entered, round_mismatch = rounds.enter(update, trainer, minibatches)  # sampled first, when new
        doing(f"training update {update}")
        trainer.refresh_anchors(minibatches)  # π_ref / π_old, when one is due now
        sampler = _sampler_mismatch(trainer, inputs) if update == 0 else {}  # before the step moves π_θ
        group_ages = None if rounds is None else rounds.ages(update)
        by_age = group_ages if rounds is not None and rounds.mixes_ages() else None
        metrics = trainer.step(minibatches[update], by_age, round_mismatch)
        if round_mismatch is not None:
            entered |= round_mismatch.metrics()
        metrics[FILTERED_FRAC] = inputs.filtered_frac
        ages = [update] if group_ages is None else list(group_ages.values())  # offline: π0 sampled the pool
        metrics.update(entered | sampler | age_metrics(ages))
        done = update + 1
        run.record(update, evaluation, metrics, last=done == config.updates)
        if on_update is not None:
            on_update(update, metrics)
        if _checkpoint_due(config, evaluations, done) or (rounds is not None and rounds.checkpoint_due(done)):
            run.flush()  # the metrics reach the store with the checkpoint that gives them
            doing(f"saving the checkpoint of update {done}")
            with profile.phase("checkpoint", done):
                trainer.save(run.folder.checkpoint(done), run.run_id)
        elif config.save_every is None and done % FLUSH_EVERY == 0:
            run.flush()
    run.record(config.updates, evaluations.at(config.updates, run.folder, trainer.drift))
    run.flush()
    doing("saving the final model")
    with profile.phase("final"):
        return trainer.save(run.folder.final, run.run_id, resumable=False)  # no resume state


def _sampler_mismatch(trainer: Trainer, inputs: RunInputs) -> dict[str, float]:
    """The pool's sampler against the learner before any update (metric_names ``sampler/``), from π0's
    log-probs: the reference's cache, or the one every run on the pool shares, scored when missing."""
    from ggpo_offline.train.sampler_mismatch import pool_mismatch

    cache = trainer.reference
    if not trainer.needs_ref:
        with trainer.profile.phase("pi0", 0):
            cache = score_pi0(trainer.config, inputs, trainer.ranks)
    with trainer.profile.phase("sampler", 0):
        return pool_mismatch(inputs.pool, cache).metrics() if trainer.ranks.main else {}


def _checkpoint_due(config: TrainConfig, evaluations: CheckpointEvaluations, done: int) -> bool:
    """A checkpoint after ``done`` updates: every --save-every, at the end, and for an evaluation due then."""
    saving = config.save_every is not None and done % config.save_every == 0
    return saving or done == config.updates or evaluations.due(done)
