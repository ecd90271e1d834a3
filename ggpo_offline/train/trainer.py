"""The replay trainer: plan → log-probs → loss → backward → step → log, one fresh minibatch per update."""

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ggpo_offline.core.errors import JobFailure, UserError
from ggpo_offline.core.model_io import load_tokenizer
from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.train.activity import doing, launched_by_ggpo
from ggpo_offline.train.batch import Minibatch, MinibatchReader
from ggpo_offline.train.checkpoint import load_state, save_checkpoint
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import (
    SINGLE_PROCESS,
    Ranks,
    all_sum,
    device_of,
    full_state_dict,
    gradient_sync,
    init_ranks,
    lost_peer_failure,
    peer_lost,
    rank_groups,
    scalar,
    wrap,
)
from ggpo_offline.train.evaluation import CheckpointEvaluations
from ggpo_offline.train.inputs import RunInputs, read_inputs, reference_pi0
from ggpo_offline.train.logprobs import ResponseLogprobs
from ggpo_offline.train.losses import LossOutput, NonFiniteCoefficient
from ggpo_offline.train.options import DEFAULT_TIMEOUTS, Timeouts
from ggpo_offline.train.pi0_cache import Pi0Cache
from ggpo_offline.train.run import FLUSH_EVERY, Run, resume_hint
from ggpo_offline.train.step_metrics import EssBlock, StepDiagnostics


@dataclass(frozen=True)
class TrainResult:
    """Where a finished run lives and how it can be found again."""

    run_dir: Path
    final_model: Path
    run_id: str | None
    pool_fingerprint: str
    data_order_fingerprint: str
    metrics: list[dict]


class Trainer:
    """Owns the model, the optimizer and the counters of one run (of this rank, when distributed)."""

    def __init__(
        self,
        config: TrainConfig,
        weights: Path,
        read_update: Callable[[int], Minibatch],
        pi0: Pi0Cache | None,
        ranks: Ranks = SINGLE_PROCESS,
        temperature: float = 1.0,
    ):
        """``weights``: the initial model or the checkpoint being resumed; ``read_update(u)`` gives this
        rank's share of the minibatch of update u; ``pi0`` serves the initial model's log-probs (needed by
        every method with a reference); ``temperature``: the pool's sampling temperature, which every
        log-prob of the run uses (`pool_temperature`)."""
        from transformers import AutoModelForCausalLM

        self.config = config
        self.ranks = ranks
        self.device = device_of(ranks)
        self.tokenizer = load_tokenizer(weights)
        self.model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32).to(self.device)
        self.learner = wrap(
            ResponseLogprobs(self.model, temperature, packed=not config.no_packing), ranks, config.fsdp
        )
        self.learner.train()
        self.sharded = ranks.distributed and config.fsdp
        # FSDP2 gathers a layer's weights at every decoder call, so all ranks must make the same calls:
        # one decoder forward per micro-batch instead of length-sorted forwards.
        self.forward_tokens = None if self.sharded else config.forward_tokens
        self.learner_record = config.learner
        self.needs_ref = "ref_logp" in self.learner_record.needs
        self.needs_old = "old_logp" in self.learner_record.needs
        self.read_update = read_update
        self.pi0 = pi0
        # π_ref and π_old are constants between refreshes: no second copy of the weights is kept, their
        # log-probs for the minibatches they will serve are computed at the refresh (update -> one tensor
        # per micro-batch). Until its first refresh π_ref is π0, served by the π0 cache.
        self.ref_window: dict[int, list[torch.Tensor]] = {}
        self.old_window: dict[int, list[torch.Tensor]] = {}
        self.optimizer = torch.optim.AdamW(
            self.learner.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.loss_fn = self.learner_record.loss
        self.loss_kwargs = self.learner_record.loss_kwargs(config)
        self.update = 0
        self.ess_block = EssBlock(config.ess_block)

    # -- state --------------------------------------------------------------------------------------
    def state(self, run_id: str | None) -> tuple[dict, dict]:
        """(the run's state, written by rank 0; this rank's own: its anchor windows, and its optimizer
        shard under FSDP2)."""
        optimizer = self.optimizer.state_dict()
        run_state = {
            "update": self.update,
            "optimizer": None if self.sharded else optimizer,
            "ess_log_weights": self.ess_block.log_weights,
            "torch_rng": torch.get_rng_state(),
            "run_id": run_id,
            "config": self.config.to_dict(),
            "world": self.ranks.world,
        }
        rank_state = {
            "ref_window": self.ref_window,
            "old_window": self.old_window,
            "optimizer": optimizer if self.sharded else None,
        }
        return run_state, rank_state

    def restore(self, checkpoint: Path) -> str | None:
        """Continue from ``checkpoint``, whose weights this trainer was built from; returns its MLflow run."""
        run_state, rank_state = load_state(checkpoint, self.ranks.rank)
        self.optimizer.load_state_dict(rank_state["optimizer"] if self.sharded else run_state["optimizer"])
        self.ref_window, self.old_window = rank_state["ref_window"], rank_state["old_window"]
        self.ess_block.log_weights = run_state["ess_log_weights"]
        torch.set_rng_state(run_state["torch_rng"])
        self.update = run_state["update"]
        return run_state["run_id"]

    def save(self, path: Path, run_id: str | None, resumable: bool = True) -> Path:
        """A Hugging Face folder of the full weights (+ resume state); every rank takes part."""
        weights = full_state_dict(self.learner)  # FSDP2: gathered on rank 0
        run_state, rank_state = self.state(run_id) if resumable else (None, None)
        return save_checkpoint(path, self.model, self.tokenizer, run_state, rank_state, self.ranks, weights)

    # -- one update ---------------------------------------------------------------------------------
    def refresh_anchors(self) -> None:
        """π_ref ← π_θ every T_ref updates (global counter); π_old ← π_θ at each TIS block start.

        A refresh runs the current weights without gradients over the minibatches the new anchor will
        serve (the next T_ref updates, or the TIS block), exactly what a frozen copy would compute then.
        """
        t_ref, block, last = self.config.ref_refresh, self.config.tis_block, self.config.updates
        if self.needs_ref and t_ref and self.update > 0 and self.update % t_ref == 0:
            self.ref_window = self._anchor_pass(range(self.update, min(self.update + t_ref, last)))
        if self.needs_old and self.update % block == 0:
            self.old_window = self._anchor_pass(range(self.update, min(self.update + block, last)))

    @torch.no_grad()
    def _anchor_pass(self, updates: range) -> dict[int, list[torch.Tensor]]:
        self.learner.eval()
        try:
            return {
                update: [
                    self.learner(micro, forward_tokens=self.forward_tokens)[0].cpu()
                    for micro in self.read_update(update).split(self.config.micro_batch_size)
                ]
                for update in updates
            }
        finally:
            self.learner.train()

    def step(self, batch: Minibatch) -> dict[str, float]:
        """One optimizer update on (this rank's share of) one minibatch: log-probs → loss → backward per
        micro-batch, then the step; returns the minibatch's metrics, reduced over ranks and computed before
        the step."""
        self.refresh_anchors()
        token_count = all_sum(batch.mask.sum(), self.ranks).to(self.device)  # T_tok of the whole minibatch
        responses = batch.num_responses * self.ranks.world
        diagnostics = StepDiagnostics(token_count, responses, self.needs_ref, self.ranks)
        self.optimizer.zero_grad(set_to_none=True)
        micros = batch.split(self.config.micro_batch_size)
        for position, micro in enumerate(micros):
            constants = self._constants(micro, position)
            mask, behavior = micro.mask.to(self.device), micro.behavior_logp.to(self.device)
            with gradient_sync(self.learner, enabled=position == len(micros) - 1):
                logp, entropy = self.learner(micro, with_entropy=True, forward_tokens=self.forward_tokens)
                out = self._loss(micro, logp, mask, token_count, constants)
                # DDP and FSDP2 average gradients over ranks; a loss normalized by the global T_tok wants
                # their sum, the 1-process gradient.
                (out.loss * self.ranks.world).backward()
            diagnostics.add(micro, logp, entropy, mask, behavior, constants.get("ref_logp"), out)
        grad_norm = scalar(torch.nn.utils.clip_grad_norm_(self.learner.parameters(), self.config.grad_clip))
        self._check_finite(diagnostics.reduce_sums()["loss"], grad_norm)
        self.optimizer.step()
        metrics = diagnostics.metrics(batch, grad_norm, self.config.method, self.ess_block)
        self.ref_window.pop(self.update, None)  # served; the checkpoint keeps only what is still due
        self.old_window.pop(self.update, None)
        self.update += 1
        return metrics

    def _loss(
        self, micro: Minibatch, logp: Tensor, mask: Tensor, token_count: Tensor, constants: dict
    ) -> LossOutput:
        """The learner's loss on one micro-batch, normalized by the minibatch's ``token_count``."""
        try:
            return self.loss_fn(
                logp=logp,
                mask=mask,
                rewards=micro.rewards.to(self.device),
                group_size=micro.group_size,
                token_count=token_count,
                **constants,
                **self.loss_kwargs,
            )
        except NonFiniteCoefficient as error:
            raise UserError(f"{error} at update {self.update}; stopped before writing a checkpoint") from None

    def _check_finite(self, loss: float, grad_norm: float) -> None:
        """Stop before the step (and so before any checkpoint) when the loss or the gradient is not finite."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise UserError(
                f"non-finite loss or gradient at update {self.update} "
                f"(loss {loss}, grad norm {grad_norm}); stopped before writing a checkpoint"
            )

    def _constants(self, micro: Minibatch, position: int) -> dict[str, torch.Tensor]:
        """The learner's constant inputs for micro-batch ``position`` of the current update."""
        constants = {"behavior_logp": micro.behavior_logp}
        if self.needs_ref:
            window = self.ref_window.get(self.update)
            constants["ref_logp"] = self.pi0.logprobs(micro) if window is None else window[position]
        if self.needs_old:
            constants["old_logp"] = self.old_window[self.update][position]
        return {k: v.to(self.device) for k, v in constants.items() if k in self.learner_record.needs}


def _threads(config: TrainConfig) -> None:
    """--threads for torch. vLLM's CPU engine, once started in this process (the evaluation), binds its
    threads to every core and turns torch.set_num_threads into a no-op; told not to bind, it keeps ours."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    on_update: Callable[[int, dict], None] | None = None,
    on_eval: Callable[[int, dict], None] | None = None,
    evaluator: Evaluator | None = None,
    parent_run_id: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> TrainResult:
    """Train ``config.method`` on the pool's planned minibatches; see TrainConfig for every setting.

    With ``config.eval_every`` the learner is evaluated at update 0, every N updates and at the end, each
    time from a checkpoint saved at that update (`CheckpointEvaluations`; ``evaluator`` shares one started
    engine between runs). ``parent_run_id`` nests the MLflow run. The run folder, resume and metric
    flushing belong to `Run`.

    Under torchrun every process calls this: each trains its contiguous share of every minibatch's groups
    (DDP, or FSDP2 with ``config.fsdp``); rank 0 alone evaluates (in a process of its own), talks to MLflow
    and writes files. No wait is unbounded (``timeouts``): a process that gives up raises a `JobFailure`.
    """
    ranks = init_ranks(timeouts)
    try:
        return _train(
            config, ranks, resume, overwrite, on_update, on_eval, evaluator, parent_run_id, timeouts
        )
    except RuntimeError as error:
        if not (ranks.distributed and peer_lost(error)):
            raise
        raise lost_peer_failure(ranks, timeouts) from None
    except JobFailure as failure:
        if launched_by_ggpo():
            raise  # the launcher says where the job can resume, once
        raise JobFailure(f"{failure}; {resume_hint(config.run_dir)}") from None


def _train(config, ranks, resume, overwrite, on_update, on_eval, evaluator, parent_run_id, timeouts):
    """`train`'s body, in the process group ``ranks`` joined."""
    from ggpo_offline.core import tracking

    doing("reading the pool")
    inputs = read_inputs(config, ranks)
    with CheckpointEvaluations(config, inputs.model_dir, ranks, evaluator, on_eval, timeouts) as evaluations:
        if not config.no_tracking and ranks.main:
            tracking.check_tracking_reachable(config.tracking_uri or tracking.default_tracking_uri())
        run = Run(config, ranks, resume=resume, overwrite=overwrite)
        _threads(config)
        trainer, run_id = _start_trainer(config, inputs, run, ranks)
        run.start(trainer.update, run_id, parent_run_id, inputs.fingerprints, inputs.tracking_params)
        with tracking.ending(run.tracker):
            while trainer.update < config.updates:
                _update(trainer, run, evaluations, inputs, on_update)
            final = _finish(trainer, run, evaluations)
        selected = evaluations.test(run.folder)
    run.finish(final, inputs.fingerprints, selected)
    fingerprints = inputs.fingerprints
    return TrainResult(
        run.folder.path,
        final,
        run.run_id,
        fingerprints["pool_fingerprint"],
        fingerprints["data_order_fingerprint"],
        run.history,
    )


def _start_trainer(
    config: TrainConfig, inputs: RunInputs, run: Run, ranks: Ranks
) -> tuple[Trainer, str | None]:
    """The trainer on the initial model, or on the checkpoint ``run`` resumes (then also its MLflow run)."""
    pi0 = reference_pi0(config, inputs, ranks)
    reader = MinibatchReader(inputs.pool, inputs.index, pad_id=inputs.tokenizer.pad_token_id or 0)

    def read_update(update: int) -> Minibatch:
        return reader.read(rank_groups(inputs.plan[update].tolist(), ranks))

    torch.manual_seed(config.seed)
    trainer = Trainer(
        config, run.resume_from or inputs.model_dir, read_update, pi0, ranks, inputs.temperature
    )
    run_id = trainer.restore(run.resume_from) if run.resume_from is not None else None
    return trainer, run_id


def _update(
    trainer: Trainer,
    run: Run,
    evaluations: CheckpointEvaluations,
    inputs: RunInputs,
    on_update: Callable[[int, dict], None] | None,
) -> None:
    """One update: the evaluation due before it, the step, its metrics kept, then a checkpoint or a flush."""
    config, update = trainer.config, trainer.update
    evaluation = evaluations.at(update, run.folder)
    doing(f"training update {update}")
    metrics = {**trainer.step(trainer.read_update(update)), "train/filtered_frac": inputs.filtered_frac}
    run.record(update, evaluation, metrics, last=trainer.update == config.updates)
    if on_update is not None:
        on_update(update, metrics)
    done = trainer.update
    saving = config.save_every is not None and done % config.save_every == 0
    if saving or done == config.updates or evaluations.due(done):
        run.flush()  # metrics reach the store together with the checkpoint that reproduces them
        doing(f"saving the checkpoint of update {done}")
        trainer.save(run.folder.checkpoint(done), run.run_id)
    elif config.save_every is None and done % FLUSH_EVERY == 0:
        run.flush()


def _finish(trainer: Trainer, run: Run, evaluations: CheckpointEvaluations) -> Path:
    """The last evaluation and metrics, then the final model (weights only, no resume state)."""
    updates = trainer.config.updates
    run.record(updates, evaluations.at(updates, run.folder))
    run.flush()
    doing("saving the final model")
    return trainer.save(run.folder.final, run.run_id, resumable=False)
