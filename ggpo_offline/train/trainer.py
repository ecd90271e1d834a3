"""The replay trainer: plan → log-probs → loss → backward → step → log, one fresh minibatch per update."""

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import initial_model_dir, load_tokenizer, tokenizer_sha256
from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.pool.source import read_pool_metadata
from ggpo_offline.pool.validate import validate_pool
from ggpo_offline.train import diagnostics as diag
from ggpo_offline.train.batch import Minibatch, MinibatchReader
from ggpo_offline.train.checkpoint import load_state, save_checkpoint
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import (
    SINGLE_PROCESS,
    Ranks,
    all_cat,
    all_max,
    all_sum,
    barrier,
    check_split,
    device_of,
    full_state_dict,
    gradient_sync,
    init_ranks,
    rank_groups,
    scalar,
    wrap,
)
from ggpo_offline.train.evaluation import CheckpointEvaluations
from ggpo_offline.train.learners import LEARNERS
from ggpo_offline.train.logprobs import ResponseLogprobs
from ggpo_offline.train.losses import DERIVED_STATS, STAT_REDUCTIONS, NonFiniteCoefficient
from ggpo_offline.train.pi0_cache import Pi0Cache, score_pool
from ggpo_offline.train.plan import (
    PoolIndex,
    data_order_fingerprint,
    index_pool,
    plan_minibatches,
    pool_fingerprint,
)
from ggpo_offline.train.run import FLUSH_EVERY, Run
from ggpo_offline.train.sampling import check_sampling

SUMMED_METRICS = ("loss", "mismatch/k3", "mismatch/drift", "policy/entropy", "ref/log_ratio")
"""Per-minibatch diagnostics normalized by global counts: micro-batches and ranks add up."""


@dataclass(frozen=True)
class TrainResult:
    """Where a finished run lives and how it can be found again."""

    run_dir: Path
    final_model: Path
    run_id: str | None
    pool_fingerprint: str
    data_order_fingerprint: str
    metrics: list[dict]


def check_tokenizer(config: TrainConfig, pool_meta: dict, tokenizer) -> None:
    expected = pool_meta.get("tokenizer", {}).get("sha256")
    if expected != tokenizer_sha256(tokenizer) and not config.allow_tokenizer_mismatch:
        raise UserError(
            f"{config.pool} was generated with a different tokenizer than the model being trained "
            "(tokenizer sha256 differs); pass --allow-tokenizer-mismatch to train anyway"
        )


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
        self.learner_record = LEARNERS[config.method]
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
        self.ess_log_weights: list[torch.Tensor] = []

    # -- state --------------------------------------------------------------------------------------
    def state(self, run_id: str | None) -> tuple[dict, dict]:
        """(the run's state, written by rank 0; this rank's own: its anchor windows, and its optimizer
        shard under FSDP2)."""
        optimizer = self.optimizer.state_dict()
        run_state = {
            "update": self.update,
            "optimizer": None if self.sharded else optimizer,
            "ess_log_weights": self.ess_log_weights,
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
        self.ess_log_weights = run_state["ess_log_weights"]
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
        """One optimizer update on (this rank's share of) one minibatch; returns the minibatch's metrics,
        reduced over ranks and computed before the step."""
        self.refresh_anchors()
        token_count = all_sum(batch.mask.sum(), self.ranks).to(self.device)  # T_tok of the whole minibatch
        responses = batch.num_responses * self.ranks.world
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys([k for k in SUMMED_METRICS if self.needs_ref or k != "ref/log_ratio"], 0.0)
        seq_log_weights, qs, stats = [], [], []
        micros = batch.split(self.config.micro_batch_size)
        for position, micro in enumerate(micros):
            constants = self._constants(micro, position)
            mask, behavior = micro.mask.to(self.device), micro.behavior_logp.to(self.device)
            with gradient_sync(self.learner, enabled=position == len(micros) - 1):
                logp, entropy = self.learner(micro, with_entropy=True, forward_tokens=self.forward_tokens)
                try:
                    out = self.loss_fn(
                        logp=logp,
                        mask=mask,
                        rewards=micro.rewards.to(self.device),
                        group_size=micro.group_size,
                        token_count=token_count,
                        **constants,
                        **self.loss_kwargs,
                    )
                except NonFiniteCoefficient as error:
                    raise UserError(
                        f"{error} at update {self.update}; stopped before writing a checkpoint"
                    ) from None
                # DDP and FSDP2 average gradients over ranks; a loss normalized by the global T_tok wants
                # their sum, the 1-process gradient.
                (out.loss * self.ranks.world).backward()
            logp = logp.detach()
            sums["loss"] += out.loss.item()
            sums["mismatch/k3"] += diag.mismatch_k3(logp, behavior, mask, token_count=token_count).item()
            sums["mismatch/drift"] += diag.mismatch_drift(
                logp, behavior, mask, token_count=token_count
            ).item()
            sums["policy/entropy"] += diag.token_entropy_mean(entropy, mask, token_count=token_count).item()
            if self.needs_ref:
                sums["ref/log_ratio"] += diag.ref_log_ratio(
                    logp, constants["ref_logp"], mask, response_count=responses
                ).item()
            seq_log_weights.append(diag.sequence_log_weights(logp, behavior, mask))
            if "q" in out.stats:
                qs.append(out.stats["q"])
            stats.append(out.stats)
        grad_norm = scalar(torch.nn.utils.clip_grad_norm_(self.learner.parameters(), self.config.grad_clip))
        totals = all_sum(torch.tensor(list(sums.values()), dtype=torch.float64), self.ranks).tolist()
        sums = dict(zip(sums, totals, strict=True))
        if not (math.isfinite(sums["loss"]) and math.isfinite(grad_norm)):
            raise UserError(
                f"non-finite loss or gradient at update {self.update} "
                f"(loss {sums['loss']}, grad norm {grad_norm}); stopped before writing a checkpoint"
            )
        self.optimizer.step()
        rewards = torch.cat([micro.rewards for micro in micros])  # in micro-batch order, like q
        metrics = self._metrics(batch, sums, grad_norm, torch.cat(seq_log_weights), qs, rewards, stats)
        self.ref_window.pop(self.update, None)  # served; the checkpoint keeps only what is still due
        self.old_window.pop(self.update, None)
        self.update += 1
        return metrics

    def _constants(self, micro: Minibatch, position: int) -> dict[str, torch.Tensor]:
        """The learner's constant inputs for micro-batch ``position`` of the current update."""
        constants = {"behavior_logp": micro.behavior_logp}
        if self.needs_ref:
            window = self.ref_window.get(self.update)
            constants["ref_logp"] = self.pi0.logprobs(micro) if window is None else window[position]
        if self.needs_old:
            constants["old_logp"] = self.old_window[self.update][position]
        return {k: v.to(self.device) for k, v in constants.items() if k in self.learner_record.needs}

    def _metrics(self, batch, sums, grad_norm, seq_log_weights, qs, rewards, stats) -> dict[str, float]:
        """Per-minibatch metrics: sums over ranks, and order-free statistics of all ranks' rows."""

        def everyone(value: torch.Tensor) -> torch.Tensor:
            return all_cat(value, self.ranks)

        metrics = dict(sums)
        seq_log_weights = everyone(seq_log_weights)
        metrics["mismatch/ess"] = diag.sequence_ess(seq_log_weights).item()
        metrics["optim/grad_norm"] = grad_norm
        metrics["train/reward"] = everyone(batch.rewards).mean().item()
        metrics["train/response_length"] = everyone(batch.mask.sum(dim=1)).mean().item()
        metrics["train/truncated_frac"] = everyone(batch.truncated.float()).mean().item()
        if qs:
            q, rewards = everyone(torch.cat(qs)), everyone(rewards)
            metrics["ggpo/q_ess"] = diag.q_ess_median(q, batch.group_size).item()
            success = diag.success_ess(q, rewards, batch.group_size)
            if success is not None:
                metrics["ggpo/success_ess"] = success.item()
        learner_stats = {}
        for key in stats[0]:
            values = [s[key].detach().double() for s in stats]
            if values[0].dim() == 0 and STAT_REDUCTIONS.get(key) == "max":
                learner_stats[key] = all_max(torch.stack(values).amax(), self.ranks).item()
            elif values[0].dim() == 0:  # scalar statistics of the learner, summed over micro-batches
                learner_stats[key] = all_sum(torch.stack(values).sum(), self.ranks).item()
            elif key == "group_loss":
                learner_stats[key] = everyone(torch.cat(values)).mean().item()
        for key, (inputs, derive) in DERIVED_STATS.items():
            if all(name in learner_stats for name in inputs):
                learner_stats[key] = derive(*(learner_stats[name] for name in inputs))
        # Learner-specific keys are named by the method (grpo/clip_frac); shared families keep their own
        # prefix (pkl/credit_mean, is/w_max, cispo/clip_frac_low), as SPEC-beyond names them.
        for key, value in learner_stats.items():
            metrics[key if "/" in key else f"{self.config.method}/{key}"] = value
        self.ess_log_weights.append(seq_log_weights.cpu())
        if len(self.ess_log_weights) == self.config.ess_block:
            metrics["mismatch/ess_block"] = diag.sequence_ess(torch.cat(self.ess_log_weights)).item()
            self.ess_log_weights = []
        return metrics


def _threads(config: TrainConfig) -> None:
    if config.threads is not None:
        torch.set_num_threads(config.threads)


@dataclass(frozen=True)
class RunInputs:
    """What a run reads, each checked, before it writes anything."""

    pool: Path
    pool_meta: dict
    model_dir: Path
    tokenizer: object
    temperature: float
    """The pool's sampling temperature, which every log-prob of the run uses."""
    index: PoolIndex
    plan: list
    fingerprints: dict

    @property
    def filtered_frac(self) -> float:
        """`train/filtered_frac`: the share of the pool's groups the mixed-reward filter removes."""
        return 1 - len(self.index.mixed_group_ids) / self.index.total_groups


def read_inputs(config: TrainConfig, ranks: Ranks = SINGLE_PROCESS) -> RunInputs:
    """The pool (validated), its initial model and tokenizer (checked against it), its sampling temperature
    (`check_sampling`), the data plan and the fingerprints that identify pool and plan."""
    check_split(config.groups_per_batch, ranks)
    pool = Path(config.pool)
    validate_pool(pool)
    pool_meta = read_pool_metadata(pool)
    model_dir = initial_model_dir(config.model, pool_meta)
    tokenizer = load_tokenizer(model_dir)
    check_tokenizer(config, pool_meta, tokenizer)
    temperature = check_sampling(pool, pool_meta, config.allow_truncated_sampling)
    index = index_pool(pool)
    plan = plan_minibatches(index, config.seed, config.updates, config.groups_per_batch)
    fingerprints = {
        "pool_fingerprint": pool_fingerprint(pool),
        "data_order_fingerprint": data_order_fingerprint(plan),
    }
    return RunInputs(pool, pool_meta, model_dir, tokenizer, temperature, index, plan, fingerprints)


def _pi0(config: TrainConfig, inputs: RunInputs, ranks: Ranks) -> Pi0Cache | None:
    """The initial model's log-probs, for every method with a reference: scored once per pool, model and
    numerics (a no-op when the cache exists) and shared by every run on the pool."""
    if "ref_logp" not in LEARNERS[config.method].needs:
        return None
    sharded, device = ranks.distributed and config.fsdp, device_of(ranks)
    options = {"sharded": sharded, "packed": not config.no_packing}
    if ranks.main:
        score_pool(inputs.pool, inputs.model_dir, device, **options)
    barrier(ranks)
    return score_pool(inputs.pool, inputs.model_dir, device, **options)


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    on_update: Callable[[int, dict], None] | None = None,
    on_eval: Callable[[int, dict], None] | None = None,
    evaluator: Evaluator | None = None,
    parent_run_id: str | None = None,
) -> TrainResult:
    """Train ``config.method`` on the pool's planned minibatches; see TrainConfig for every setting.

    With ``config.eval_every`` the learner is evaluated at update 0, every N updates and at the end, each
    time from a checkpoint saved at that update (`CheckpointEvaluations`; ``evaluator`` shares one started
    engine between runs). ``parent_run_id`` nests the MLflow run. The run folder, resume and metric
    flushing belong to `Run`.

    Under torchrun every process calls this: each trains its contiguous share of every minibatch's groups
    (DDP, or FSDP2 with ``config.fsdp``); rank 0 alone evaluates, talks to MLflow and writes files.
    """
    from ggpo_offline.core import tracking

    ranks = init_ranks()
    inputs = read_inputs(config, ranks)
    with CheckpointEvaluations(config, inputs.model_dir, ranks, evaluator, on_eval) as evaluations:
        if not config.no_tracking and ranks.main:
            tracking.check_tracking_reachable(config.tracking_uri or tracking.default_tracking_uri())
        run = Run(config, ranks, resume=resume, overwrite=overwrite)
        _threads(config)
        pi0 = _pi0(config, inputs, ranks)
        reader = MinibatchReader(inputs.pool, inputs.index, pad_id=inputs.tokenizer.pad_token_id or 0)

        def read_update(update: int) -> Minibatch:
            return reader.read(rank_groups(inputs.plan[update].tolist(), ranks))

        torch.manual_seed(config.seed)
        trainer = Trainer(
            config, run.resume_from or inputs.model_dir, read_update, pi0, ranks, inputs.temperature
        )
        run_id = trainer.restore(run.resume_from) if run.resume_from is not None else None
        params = {"model_dir": str(inputs.model_dir), **_sampling_params(inputs.pool_meta)}
        run.start(trainer.update, run_id, parent_run_id, inputs.fingerprints, params)
        with tracking.ending(run.tracker):
            while trainer.update < config.updates:
                update = trainer.update
                evaluation = evaluations.at(update, run.folder)
                metrics = {**trainer.step(read_update(update)), "train/filtered_frac": inputs.filtered_frac}
                run.record(update, evaluation, metrics, last=trainer.update == config.updates)
                if on_update is not None:
                    on_update(update, metrics)
                done = trainer.update
                saving = config.save_every is not None and done % config.save_every == 0
                if saving or done == config.updates or evaluations.due(done):
                    run.flush()  # metrics reach the store together with the checkpoint that reproduces them
                    trainer.save(run.folder.checkpoint(done), run.run_id)
                elif config.save_every is None and done % FLUSH_EVERY == 0:
                    run.flush()
            run.record(config.updates, evaluations.at(config.updates, run.folder))
            run.flush()
            final = trainer.save(run.folder.final, run.run_id, resumable=False)
    run.finish(final, inputs.fingerprints)
    fingerprints = inputs.fingerprints
    return TrainResult(
        run.folder.path,
        final,
        run.run_id,
        fingerprints["pool_fingerprint"],
        fingerprints["data_order_fingerprint"],
        run.history,
    )


def _sampling_params(pool_meta: dict) -> dict:
    """The pool's sampling settings as MLflow params (pool_temperature, pool_top_p, ...)."""
    return {f"pool_{k}": v for k, v in pool_meta.get("sampling", {}).items() if k != "seed"}
