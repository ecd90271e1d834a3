"""The replay trainer: plan → log-probs → loss → backward → step → log, one fresh minibatch per update."""

import inspect
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ggpo_offline import __version__
from ggpo_offline import diagnostics as diag
from ggpo_offline.errors import UserError
from ggpo_offline.evaluate import Evaluator, write_json
from ggpo_offline.losses import LOSSES, method_needs
from ggpo_offline.model_io import initial_model_dir, load_tokenizer, tokenizer_sha256
from ggpo_offline.pool.schema import read_pool_metadata
from ggpo_offline.pool.validate import validate_pool
from ggpo_offline.train.batch import Minibatch, MinibatchReader
from ggpo_offline.train.checkpoint import checkpoint_dir, latest_checkpoint, load_state, save_checkpoint
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.evaluation import eval_config, eval_due, eval_metrics, eval_report_path
from ggpo_offline.train.logprobs import default_device, response_logprobs
from ggpo_offline.train.pi0_cache import Pi0Cache, score_pool
from ggpo_offline.train.plan import data_order_fingerprint, index_pool, plan_minibatches, pool_fingerprint

METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
"""Written last: a run folder holding it is a finished run (compare reuses such runs)."""
# Without checkpoints, metrics still reach the tracker this often (updates).
FLUSH_EVERY = 20


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


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """A run folder is only reused on --resume and only replaced on --overwrite."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if resume:
            return
        if not overwrite:
            raise UserError(
                f"{run_dir} already exists; pass --resume to continue it or --overwrite to replace it"
            )
        shutil.rmtree(run_dir)
    elif resume:
        raise UserError(f"--resume: {run_dir} holds no run to resume")
    run_dir.mkdir(parents=True, exist_ok=True)


def _loss_kwargs(config: TrainConfig) -> dict:
    """The learner's keyword hyperparameters, taken from the config by name (beta, clip, clip_eps, ...)."""
    parameters = inspect.signature(LOSSES[config.method]).parameters
    return {
        name: getattr(config, name)
        for name, p in parameters.items()
        if p.kind is p.KEYWORD_ONLY and hasattr(config, name)
    }


class Trainer:
    """Owns the models, the optimizer and the counters of one run."""

    def __init__(
        self,
        config: TrainConfig,
        model_dir: Path,
        device: torch.device,
        read_update: Callable[[int], Minibatch],
        pi0: Pi0Cache | None,
    ):
        """``read_update(u)`` gives the minibatch of update u; ``pi0`` serves the initial model's log-probs
        (needed by every method with a reference)."""
        from transformers import AutoModelForCausalLM

        self.config = config
        self.device = device
        self.tokenizer = load_tokenizer(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
        self.model.train()
        needs = method_needs(config.method)
        self.needs_ref, self.needs_old = "ref_logp" in needs, "old_logp" in needs
        self.read_update = read_update
        self.pi0 = pi0
        # π_ref and π_old are constants between refreshes: no second copy of the weights is kept, their
        # log-probs for the minibatches they will serve are computed at the refresh (update -> one tensor
        # per micro-batch). Until its first refresh π_ref is π0, served by the π0 cache.
        self.ref_window: dict[int, list[torch.Tensor]] = {}
        self.old_window: dict[int, list[torch.Tensor]] = {}
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay,
        )
        self.loss_fn = LOSSES[config.method]
        self.loss_kwargs = _loss_kwargs(config)
        self.update = 0
        self.ess_log_weights: list[torch.Tensor] = []

    # -- state --------------------------------------------------------------------------------------
    def state(self, run_id: str | None) -> dict:
        return {
            "update": self.update,
            "optimizer": self.optimizer.state_dict(),
            "ref_window": self.ref_window,
            "old_window": self.old_window,
            "ess_log_weights": self.ess_log_weights,
            "torch_rng": torch.get_rng_state(),
            "run_id": run_id,
            "config": self.config.to_dict(),
        }

    def load(self, checkpoint: Path, state: dict) -> None:
        from transformers import AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
        self.model.load_state_dict(saved.state_dict())
        self.optimizer.load_state_dict(state["optimizer"])
        self.ref_window, self.old_window = state["ref_window"], state["old_window"]
        self.ess_log_weights = state["ess_log_weights"]
        torch.set_rng_state(state["torch_rng"])
        self.update = state["update"]

    # -- one update ---------------------------------------------------------------------------------
    def refresh_anchors(self) -> None:
        """π_ref ← π_θ every T_ref updates (global counter); π_old ← π_θ at each TIS block start.

        A refresh runs the current weights without gradients over the minibatches the new anchor will
        serve (the next T_ref updates, or the TIS block), exactly what a frozen copy would compute then.
        """
        t_ref, block, last = self.config.effective_ref_refresh, self.config.tis_block, self.config.updates
        if self.needs_ref and t_ref and self.update > 0 and self.update % t_ref == 0:
            self.ref_window = self._anchor_pass(range(self.update, min(self.update + t_ref, last)))
        if self.needs_old and self.update % block == 0:
            self.old_window = self._anchor_pass(range(self.update, min(self.update + block, last)))

    @torch.no_grad()
    def _anchor_pass(self, updates: range) -> dict[int, list[torch.Tensor]]:
        self.model.eval()
        try:
            return {
                update: [
                    response_logprobs(self.model, micro, forward_tokens=self.config.forward_tokens)[0].cpu()
                    for micro in self.read_update(update).split(self.config.micro_batch_size)
                ]
                for update in updates
            }
        finally:
            self.model.train()

    def step(self, batch: Minibatch) -> dict[str, float]:
        """One optimizer update on one minibatch; returns its metrics (computed before the step)."""
        self.refresh_anchors()
        token_count = batch.mask.sum().to(self.device)  # T_tok of the whole minibatch (SPEC)
        responses = batch.num_responses
        self.optimizer.zero_grad(set_to_none=True)
        sums = {
            "loss": 0.0,
            "mismatch/k3": 0.0,
            "mismatch/drift": 0.0,
            "policy/entropy": 0.0,
            "ref/log_ratio": 0.0,
        }
        seq_log_weights, qs, stats = [], [], []
        micros = batch.split(self.config.micro_batch_size)
        for position, micro in enumerate(micros):
            constants = self._constants(micro, position)
            logp, entropy = response_logprobs(
                self.model, micro, with_entropy=True, forward_tokens=self.config.forward_tokens
            )
            mask, behavior = micro.mask.to(self.device), micro.behavior_logp.to(self.device)
            out = self.loss_fn(
                logp=logp,
                mask=mask,
                rewards=micro.rewards.to(self.device),
                group_size=micro.group_size,
                token_count=token_count,
                **constants,
                **self.loss_kwargs,
            )
            out.loss.backward()
            logp = logp.detach()
            sums["loss"] += out.loss.item()
            sums["mismatch/k3"] += diag.mismatch_k3(logp, behavior, mask, token_count=token_count).item()
            sums["mismatch/drift"] += diag.mismatch_drift(
                logp, behavior, mask, token_count=token_count
            ).item()
            sums["policy/entropy"] += diag.token_entropy_mean(entropy, mask, token_count=token_count).item()
            sums["ref/log_ratio"] += diag.ref_log_ratio(
                logp, constants["ref_logp"], mask, response_count=responses
            ).item()
            seq_log_weights.append(diag.sequence_log_weights(logp, behavior, mask))
            if "q" in out.stats:
                qs.append(out.stats["q"])
            stats.append(out.stats)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip).item()
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
        needs = method_needs(self.config.method)
        return {k: v.to(self.device) for k, v in constants.items() if k in needs}

    def _metrics(self, batch, sums, grad_norm, seq_log_weights, qs, rewards, stats) -> dict[str, float]:
        metrics = dict(sums)
        metrics["mismatch/ess"] = diag.sequence_ess(seq_log_weights).item()
        metrics["optim/grad_norm"] = grad_norm
        metrics["train/reward"] = batch.rewards.mean().item()
        metrics["train/response_length"] = batch.mask.sum(dim=1).mean().item()
        metrics["train/truncated_frac"] = batch.truncated.float().mean().item()
        if qs:
            q, rewards = torch.cat(qs), rewards.to(self.device)
            metrics["ggpo/q_ess"] = diag.q_ess_median(q, batch.group_size).item()
            success = diag.success_ess(q, rewards, batch.group_size)
            if success is not None:
                metrics["ggpo/success_ess"] = success.item()
        for key in stats[0]:
            if stats[0][key].dim() == 0:  # scalar statistics of the learner, summed over micro-batches
                metrics[f"{self.config.method}/{key}"] = sum(s[key].item() for s in stats)
            elif key == "group_loss":
                metrics[f"{self.config.method}/group_loss"] = torch.cat([s[key] for s in stats]).mean().item()
        self.ess_log_weights.append(seq_log_weights.cpu())
        if len(self.ess_log_weights) == self.config.ess_block:
            metrics["mismatch/ess_block"] = diag.sequence_ess(torch.cat(self.ess_log_weights)).item()
            self.ess_log_weights = []
        return metrics


def _device(config: TrainConfig) -> torch.device:
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    return default_device()


def _write_metrics(path: Path, records: list[dict]) -> None:
    with path.open("a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def _read_metrics(path: Path, before_update: int) -> list[dict]:
    """Metric records of updates before ``before_update`` (a resumed run recomputes the rest)."""
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [r for r in records if r["update"] < before_update]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


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
    time from a checkpoint saved at that update; ``evaluator`` shares one (started engine, evaluation
    protocol) between runs, by default the run starts its own. ``parent_run_id`` nests the MLflow run.
    """
    from ggpo_offline import tracking

    pool = Path(config.pool)
    validate_pool(pool)
    pool_meta = read_pool_metadata(pool)
    model_dir = initial_model_dir(config.model, pool_meta)
    tokenizer = load_tokenizer(model_dir)
    check_tokenizer(config, pool_meta, tokenizer)
    index = index_pool(pool)
    plan = plan_minibatches(index, config.seed, config.updates, config.groups_per_batch)
    fingerprints = {
        "pool_fingerprint": pool_fingerprint(pool),
        "data_order_fingerprint": data_order_fingerprint(plan),
    }
    owns_evaluator = evaluator is None and config.eval_every is not None
    if owns_evaluator:
        # Built here, before anything is written: it checks the benchmarks.
        evaluator = Evaluator(eval_config(config, model_dir))
    tracking_uri = config.tracking_uri or tracking.default_tracking_uri()
    if not config.no_tracking:
        tracking.check_tracking_reachable(tracking_uri)
    run_dir = config.run_dir
    prepare_run_dir(run_dir, resume, overwrite)

    device = _device(config)
    pi0 = None
    if "ref_logp" in method_needs(config.method):
        # Scored once per pool and model (a no-op when the cache exists), shared by every run on the pool.
        pi0 = score_pool(pool, model_dir, device)
    reader = MinibatchReader(pool, index, pad_id=tokenizer.pad_token_id or 0)
    torch.manual_seed(config.seed)
    trainer = Trainer(config, model_dir, device, lambda update: reader.read(plan[update].tolist()), pi0)
    run_id = None
    if resume:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise UserError(f"--resume: {run_dir} has no checkpoint to resume from")
        state = load_state(checkpoint)
        if "ref_window" not in state:
            raise UserError(f"--resume: {checkpoint} comes from an older ggpo-offline; start the run again")
        if state["config"] != config.to_dict():
            raise UserError(f"--resume: the settings differ from those of the run in {run_dir}")
        trainer.load(checkpoint, state)
        run_id = state["run_id"]
    metrics_path = run_dir / METRICS_FILE
    history = _read_metrics(metrics_path, trainer.update)

    tracker = tracking.start_tracking(
        experiment=config.experiment or pool.stem,
        run_name=config.run_name,
        tracking_uri=config.tracking_uri,
        resume_run_id=run_id,
        parent_run_id=parent_run_id,
        enabled=not config.no_tracking,
    )
    if run_id is None:
        tracker.log_params({**config.to_dict(), "model_dir": str(model_dir)})
        tracker.set_tags({**fingerprints, "ggpo_offline_version": __version__, "method": config.method})
        tracker.log_dict(config.to_dict(), "config.json")
        (run_dir / "config.json").write_text(json.dumps({**config.to_dict(), **fingerprints}, indent=2))

    pending: list[dict] = []

    def flush() -> None:
        for record in pending:
            tracker.log_metrics({k: v for k, v in record.items() if k != "update"}, step=record["update"])
        tracker.flush()
        _write_metrics(metrics_path, pending)
        history.extend(pending)
        pending.clear()

    def evaluate_at(update: int) -> dict[str, float]:
        weights = model_dir if update == 0 else checkpoint_dir(run_dir, update)
        report = evaluator.evaluate(weights)
        write_json(report, eval_report_path(run_dir, update))
        if on_eval is not None:
            on_eval(update, report)
        return eval_metrics(report)

    status = "FAILED"
    try:
        while trainer.update < config.updates:
            update = trainer.update
            record = {"update": update}
            if eval_due(config, update):
                record.update(evaluate_at(update))
            metrics = trainer.step(reader.read(plan[update].tolist()))
            if update % config.log_every == 0 or trainer.update == config.updates:
                record.update(metrics)
            if len(record) > 1:
                pending.append(record)
            if on_update is not None:
                on_update(update, metrics)
            saving = config.save_every is not None and trainer.update % config.save_every == 0
            if saving or trainer.update == config.updates or eval_due(config, trainer.update):
                flush()  # metrics reach the store together with the checkpoint that reproduces them
                save_checkpoint(
                    checkpoint_dir(run_dir, trainer.update),
                    trainer.model,
                    trainer.tokenizer,
                    trainer.state(tracker.run_id),
                )
            elif config.save_every is None and trainer.update % FLUSH_EVERY == 0:
                flush()
        if eval_due(config, config.updates):
            pending.append({"update": config.updates, **evaluate_at(config.updates)})
            flush()
        final = save_checkpoint(run_dir / "final", trainer.model, trainer.tokenizer, None)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.close(status)
        if owns_evaluator:
            evaluator.close()
    write_json(
        {
            "run_id": tracker.run_id,
            "tracking_uri": None if config.no_tracking else tracking_uri,
            **fingerprints,
            "updates": config.updates,
            "final_model": str(final),
        },
        run_dir / RESULT_FILE,
    )
    return TrainResult(
        run_dir,
        final,
        tracker.run_id,
        fingerprints["pool_fingerprint"],
        fingerprints["data_order_fingerprint"],
        history,
    )
