"""The schema of ``ggpo train``: what it trains (`TrainConfig`) and how it runs (`TrainOptions`), each
refusing a bad value where it is built. Training presets and config files resolve into it in
`training_presets`."""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import (
    Range,
    above,
    at_least,
    check_relations,
    check_settings,
    flag_name,
    leaf_values,
    setting,
)
from ggpo_offline.evaluate.config import TrainingEvalConfig
from ggpo_offline.train.learners import (
    LEARNERS,
    PAPER_REF_REFRESH,
    SETTINGS,
    Learner,
    learner,
    read_by,
    ref_refresh_help,
)
from ggpo_offline.train.run_records import RunId

FORWARD_TOKENS = 4096
"""Padded (prompt + response) positions per decoder forward: rows are length-sorted and run in forwards of at
most this many positions (a longer row runs alone), each cut to its own longest row, so padding is small."""
PER_RUN = ("pool", "method", "seed", "out")
"""Settings `ggpo compare` chooses for each of its runs (a user gives the others, shared by all runs)."""
Preset = Literal["paper-offline", "tiny", "arc"]
"""The training presets' names (`training_presets.PRESETS` holds their settings)."""
METHOD_DEFAULT = "method-default"
"""``ref_refresh`` not chosen: resolved on construction to the method's own default (`TrainConfig`)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``ggpo train`` needs. Defaults are SPEC.md's paper defaults (offline setting)."""

    pool: Path = setting(Path("pools/base.parquet"), "The pool to replay (a file or a shard directory).")
    method: str = setting("ggpo", f"Learner: {', '.join(LEARNERS)} (README, docs/corrections.md).")
    model: str | None = setting(None, "Initial policy, a local HF folder [default: the pool's model].")
    seed: int = setting(
        42, "Seeds the data plan (which groups, in which order) and torch.", valid=at_least(0)
    )
    updates: int = setting(
        400, "U: optimizer updates; each uses a fresh minibatch, none revisited.", valid=at_least(1)
    )
    groups_per_batch: int = setting(32, "G: groups per minibatch (B = G·m responses).", valid=at_least(1))
    lr: float = setting(1e-6, "AdamW learning rate (constant, no warmup).", valid=above(0))
    beta: float = setting(0.01, f"β: KL-regularization strength (>= 0). {read_by('beta')}", valid=at_least(0))
    clip: float = setting(
        0.05,
        f"c_clip: per-token clip of the learner-to-reference log ratio. {read_by('clip')}",
        valid=above(0),
    )
    push_bound: float = setting(
        10.0,
        "B (nats): a wrong response's push stops once its sequence log-ratio to π_ref is at or below −B "
        f"(an ablation's setting, not tuned). {read_by('push_bound')}",
        valid=above(0),
    )
    ref_refresh: int | None | Literal["method-default"] = setting(
        METHOD_DEFAULT,
        f"T_ref: π_ref ← π_θ every N updates, or 'never' {ref_refresh_help()}",
        none_word="never",
        valid=at_least(1),
    )
    horizon: int | None = setting(
        None,
        "H: tokens of future KL credit, or 'full' for the whole tail [default: full] (SPEC-beyond "
        f"PROVISIONAL). {read_by('horizon')}",
        none_word="full",
        valid=at_least(0),
    )
    cost_bound: float = setting(
        0.05,
        "ε_F: bound on each token's KL cost in the future credit (SPEC-beyond PROVISIONAL). "
        + read_by("cost_bound"),
        valid=above(0),
    )
    cispo_low: float = setting(
        0.0, f"c_lo: lower bound of the detached token weight. {read_by('cispo_low')}", valid=at_least(0)
    )
    cispo_high: float = setting(
        1.28,
        f"c_hi: upper bound of the detached token weight (SPEC-beyond PROVISIONAL). {read_by('cispo_high')}",
        valid=at_least(0),
    )
    tis_block: int = setting(
        8,
        f"π_old is recomputed at the start of every block of N updates. {read_by('tis_block')}",
        valid=at_least(1),
    )
    tis_cap: float = setting(2.0, f"Cap of the token weight π_old/μ. {read_by('tis_cap')}", valid=above(0))
    clip_eps: float = setting(
        0.2,
        f"ε: PPO clip range of the token ratio. {read_by('clip_eps')}",
        valid=Range(0, 1, low_open=True, high_open=True),
    )
    dual_clip: float = setting(
        10.0, f"c: dual-clip bound for negative advantages. {read_by('dual_clip')}", valid=above(1)
    )
    kl_coef: float = setting(
        0.01, f"Coefficient of the k3 KL to the reference. {read_by('kl_coef')}", valid=at_least(0)
    )
    weight_decay: float = setting(0.01, "AdamW weight decay.", valid=at_least(0))
    adam_beta1: float = setting(0.9, "AdamW β1.", valid=Range(0, 1, high_open=True))
    adam_beta2: float = setting(0.999, "AdamW β2.", valid=Range(0, 1, high_open=True))
    adam_eps: float = setting(1e-8, "AdamW ε (torch's default).", valid=above(0))
    grad_clip: float = setting(1.0, "Clip the global gradient norm to this.", valid=above(0))
    micro_batch_size: int | None = setting(
        None,
        "Responses per forward/backward pass, a multiple of m [default: the whole minibatch].",
        valid=at_least(1),
    )
    forward_tokens: int = setting(
        FORWARD_TOKENS,
        "Prompt + response positions per decoder forward inside a pass (padded ones count with "
        "--no-packing).",
        valid=at_least(1),
    )
    no_packing: bool = setting(
        False,
        "Run each pass's rows as length-sorted padded forwards instead of packed padding-free ones "
        "(per-document attention; models whose attention cannot be packed are padded anyway).",
    )
    fsdp: bool = setting(
        False, "With several processes: shard the model with FSDP2 instead of replicating it with DDP (GPUs)."
    )
    sync_every: int | None = setting(
        None,
        "N: every N updates the current policy samples the next round of N x G mixed groups with the pool's "
        "prompts and settings (Algorithm 1); absent: the pool is replayed offline (N = U).",
        valid=at_least(1),
    )
    off_policy_steps: int = setting(
        0,
        "K: asynchronous training, each --sync-every round sampled by the policy K updates before the "
        "round starts (prime-rl's max_async_level, AReaL's max_head_offpolicyness: a rollout consumed at "
        "step t was sampled by version t − K); the pool serves every update whose sampler would be π0. 0: "
        "synchronous.",
        valid=at_least(0),
    )
    lag: Literal["fixed", "mixed"] = setting(
        "fixed",
        "How --off-policy-steps K lags the samples: fixed, every group of a round K updates behind its "
        "start; mixed, each minibatch G/K groups of each age 1..K, as an asynchronous sampler bounded by K "
        "delivers them (needs --sync-every 1 and G divisible by K).",
    )
    sync_dataset: str | None = setting(
        None,
        "The prompts of the --sync-every rounds, as generate-pool's --dataset gives them [default: the "
        "pool's own dataset, from the prompt after its last].",
    )
    behavior_logprobs: Literal["engine", "learner"] = setting(
        "engine",
        "The behavior log-probs of the --sync-every rounds: the sampling engine's, or the learner's on the "
        "sampling checkpoint (the control without training-inference mismatch).",
    )
    log_every: int = setting(
        1, "Log metrics every N updates (block ESS at every block end regardless).", valid=at_least(1)
    )
    ess_block: int = setting(
        8, "Updates per block of the block-level sequence ESS (paper: 8 minibatches).", valid=at_least(1)
    )
    probe_groups: int = setting(
        8,
        "Pool groups of the fixed probe on which each evaluated checkpoint's drift from π0 (probe/k3, "
        "probe/log_ratio) is measured: the pool's first mixed groups (0 = no probe).",
        valid=at_least(0),
    )
    save_every: int | None = setting(
        None, "Checkpoint every N updates (and always at the end).", valid=at_least(1)
    )
    out: Path | None = setting(None, "Run folder [default: runs/<pool name>/<method>-s<seed>].")
    threads: int | None = setting(None, "CPU threads for torch [default: torch's].", valid=at_least(1))
    tracking_uri: str | None = setting(
        None, "MLflow store [default: $MLFLOW_TRACKING_URI or sqlite:///mlruns.db]."
    )
    experiment: str | None = setting(None, "MLflow experiment [default: the pool's file name].")
    no_tracking: bool = setting(False, "Train without MLflow.")
    allow_tokenizer_mismatch: bool = setting(False, "Train a model whose tokenizer differs from the pool's.")
    allow_truncated_sampling: bool = setting(
        False,
        "Train on a pool sampled with top-p < 1 or top-k > 0, whose behavior log-probs (of the truncated "
        "distribution) a full-vocabulary log-prob cannot match; refused otherwise.",
    )
    evaluation: TrainingEvalConfig = setting(default_factory=TrainingEvalConfig)
    """The in-training evaluation (its fields are this config's settings: ``eval_every``, ``eval_n``, ...)."""

    def __post_init__(self) -> None:
        if self.ref_refresh == METHOD_DEFAULT:
            refreshes = self.method in LEARNERS and self.learner.refreshes_reference
            default = PAPER_REF_REFRESH if refreshes else None
            object.__setattr__(self, "ref_refresh", default)
        method = self.learner  # an unknown method is the first problem reported
        check_settings(self, skip=tuple(name for name in SETTINGS if not method.reads(name)))
        check_relations(_relations(self, method))

    @property
    def learner(self) -> Learner:
        """The registry's record of ``method`` (`UnknownMethod`, a UserError, for one it does not hold)."""
        return learner(self.method)

    @property
    def run_name(self) -> str:
        return RunId(self.method, self.seed).folder_name

    @property
    def run_dir(self) -> Path:
        return self.out if self.out is not None else Path("runs") / Path(self.pool).stem / self.run_name

    def to_dict(self) -> dict:
        """JSON-ready values (paths as strings, tuples as lists), as stored in config.json: one key per
        setting, the evaluation's flattened in its place."""
        return json.loads(json.dumps(leaf_values(self), default=str))


@dataclass(frozen=True)
class ScoreConfig:
    """What ``ggpo pool score`` scores the pool under (the π0 cache every run shares)."""

    model: str | None = setting(None, "Initial policy folder [default: the pool's model].")


@dataclass(frozen=True)
class Timeouts:
    """How long (seconds) a process of the job waits for the others before the job stops: at any
    collective or barrier, and while rank 0 works alone (scoring the π0 cache, evaluating a checkpoint)."""

    collective: float = 1800.0
    solo: float = 7200.0


DEFAULT_TIMEOUTS = Timeouts()


@dataclass(frozen=True)
class TrainOptions:
    """How ``ggpo train`` runs, beside what it trains (`TrainConfig`)."""

    preset: Preset | None = setting(
        None, "paper-offline (SPEC defaults), tiny (embedded model, ~1 min) or arc (embedded, the long run)."
    )
    config_file: Path | None = setting(
        None, "TOML/YAML/JSON file of settings (flags override it).", flag="config"
    )
    nproc: int | None = setting(
        None,
        "Train in N processes on this machine (torchrun; DDP, or FSDP2 with --fsdp) [default: 1].",
        valid=at_least(1),
    )
    resume: bool = setting(False, "Continue the run in --out from its last checkpoint.")
    overwrite: bool = setting(False, "Replace an existing run folder.")
    resume_if_any: bool = setting(
        False,
        "Carry the run in --out on from whatever state it is in: resume from its last checkpoint, start it "
        "(again) when it has none, leave it as it is when finished. What a launcher's job runs, so that a "
        "requeued job resumes.",
    )
    dry_run: bool = setting(
        False,
        "Print the plan (settings, data, evaluations, a time estimate) after every check the real run makes, "
        "and exit; writes nothing.",
    )
    collective_timeout: float = setting(
        DEFAULT_TIMEOUTS.collective,
        "With several processes: seconds a process waits for the others at a collective before the job "
        "stops (a stuck or dead peer).",
        valid=above(0),
    )
    wait_timeout: float = setting(
        DEFAULT_TIMEOUTS.solo,
        "With several processes: seconds the others wait while process 0 works alone (one checkpoint's "
        "evaluation, scoring the π0 cache), and the longest one evaluation may take.",
        valid=above(0),
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.resume_if_any and (self.resume or self.overwrite):
            raise UserError("--resume-if-any decides between --resume and --overwrite itself: give it alone")
        if self.resume_if_any and os.environ.get("WORLD_SIZE", "1") != "1":
            raise UserError("--resume-if-any starts its own processes: give --nproc instead of torchrun")

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.collective_timeout, self.wait_timeout)


def _relations(config: TrainConfig, method: Learner) -> list[tuple[bool, str]]:
    """What must hold between the settings, each in range (`check_settings`): a learner's own bound on a
    setting it reads (β > 0 where its loss divides by β), and how the rounds' settings go together."""
    bounds = [
        (bound.admits(getattr(config, name)), f"--{flag_name(TrainConfig, name)} must be {bound} for "
         f"{method.name}, got {getattr(config, name)}")
        for name, bound in method.bounds.items()
    ]  # fmt: skip
    return [
        *bounds,
        (
            not method.reads("cispo_low") or config.cispo_low <= config.cispo_high,
            f"CISPO needs --cispo-low <= --cispo-high, got {config.cispo_low}, {config.cispo_high}",
        ),
        # A config may still ask a learner without π_ref to refresh one; resolution drops a preset's T_ref.
        (
            config.ref_refresh is None or method.reads("ref_refresh"),
            f"--ref-refresh: {method.name} has no reference to refresh",
        ),
        (
            config.sync_every is None or config.sync_every <= config.updates,
            f"--sync-every must be in 1..{config.updates} (--updates), got {config.sync_every}",
        ),
        (
            config.sync_every is not None
            or (config.sync_dataset, config.behavior_logprobs, config.off_policy_steps)
            == (None, "engine", 0),
            "--sync-dataset, --behavior-logprobs and --off-policy-steps set how --sync-every samples its "
            "rounds: give --sync-every",
        ),
        (
            config.off_policy_steps < config.updates,
            f"--off-policy-steps must be in 0..{config.updates - 1} (--updates - 1), got "
            f"{config.off_policy_steps}",
        ),
        (
            config.lag == "fixed"
            or (
                config.sync_every == 1
                and config.off_policy_steps >= 1
                and config.behavior_logprobs == "engine"
            ),
            "--lag mixed mixes the ages of each minibatch: give it with --sync-every 1 and "
            "--off-policy-steps K >= 1 (its rounds have one sampler per age, so --behavior-logprobs stays "
            "engine)",
        ),
        (
            config.lag == "fixed" or config.groups_per_batch % max(config.off_policy_steps, 1) == 0,
            f"--lag mixed splits each minibatch into --off-policy-steps {config.off_policy_steps} equal "
            f"shares: --groups-per-batch {config.groups_per_batch} is not divisible by it",
        ),
    ]
