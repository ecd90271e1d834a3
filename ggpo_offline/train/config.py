"""The training configuration: a frozen dataclass, presets, config files and flag overrides."""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import check_choices, flag_name, load_config_file, normalize, setting
from ggpo_offline.evaluate.config import DEFAULT_KS
from ggpo_offline.generate.engines.base import EngineName
from ggpo_offline.train.learners import (
    LEARNERS,
    PAPER_REF_REFRESH,
    TUNED_LR,
    Learner,
    PerLearner,
    learner,
    named,
    read_by,
    readers,
    ref_refresh_help,
)
from ggpo_offline.train.learners import SETTINGS as LEARNER_SETTINGS

FORWARD_TOKENS = 4096
"""Padded (prompt + response) positions per decoder forward: rows are length-sorted and run in forwards of at
most this many positions (a longer row runs alone), each cut to its own longest row, so padding is small."""
PER_RUN = ("pool", "method", "seed", "out")
"""Settings `ggpo compare` chooses for each of its runs (a user gives the others, shared by all runs)."""
VALIDATION_DATASETS = ("arith:validation",)
TEST_DATASETS = ("arith:test",)
HELD_OUT_SPLITS = ("arith:test",)
"""Dataset specs that are a test split by name: in-training evaluation may not use them."""
METHOD_DEFAULT = "method-default"
"""``ref_refresh`` not chosen: resolved on construction to the method's own default (`TrainConfig`)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``ggpo train`` needs. Defaults are SPEC.md's paper defaults (offline setting)."""

    pool: Path = setting(Path("pools/base.parquet"), "The pool to replay (a file or a shard directory).")
    method: str = setting("ggpo", f"Learner: {', '.join(LEARNERS)} (README, docs/corrections.md).")
    model: str | None = setting(None, "Initial policy, a local HF folder [default: the pool's model].")
    seed: int = setting(42, "Seeds the data plan (which groups, in which order) and torch.")
    updates: int = setting(400, "U: optimizer updates; each uses a fresh minibatch, none revisited.")
    groups_per_batch: int = setting(32, "G: groups per minibatch (B = G·m responses).")
    lr: float = setting(1e-6, "AdamW learning rate (constant, no warmup).")
    beta: float = setting(0.01, f"β: KL-regularization strength. {read_by('beta')}")
    clip: float = setting(
        0.05, f"c_clip: per-token clip of the learner-to-reference log ratio. {read_by('clip')}"
    )
    push_bound: float = setting(
        10.0,
        "B (nats): a wrong response's push stops once its sequence log-ratio to π_ref is at or below −B "
        f"(an ablation's setting, not tuned). {read_by('push_bound')}",
    )
    ref_refresh: int | None | Literal["method-default"] = setting(
        METHOD_DEFAULT,
        f"T_ref: π_ref ← π_θ every N updates, or 'never' {ref_refresh_help()}",
        none_word="never",
    )
    horizon: int | None = setting(
        None,
        "H: tokens of future KL credit, or 'full' for the whole tail [default: full] (SPEC-beyond "
        f"PROVISIONAL). {read_by('horizon')}",
        none_word="full",
    )
    cost_bound: float = setting(
        0.05,
        "ε_F: bound on each token's KL cost in the future credit (SPEC-beyond PROVISIONAL). "
        + read_by("cost_bound"),
    )
    cispo_low: float = setting(0.0, f"c_lo: lower bound of the detached token weight. {read_by('cispo_low')}")
    cispo_high: float = setting(
        1.28,
        f"c_hi: upper bound of the detached token weight (SPEC-beyond PROVISIONAL). {read_by('cispo_high')}",
    )
    tis_block: int = setting(
        8, f"π_old is recomputed at the start of every block of N updates. {read_by('tis_block')}"
    )
    tis_cap: float = setting(2.0, f"Cap of the token weight π_old/μ. {read_by('tis_cap')}")
    clip_eps: float = setting(0.2, f"ε: PPO clip range of the token ratio. {read_by('clip_eps')}")
    dual_clip: float = setting(10.0, f"c: dual-clip bound for negative advantages. {read_by('dual_clip')}")
    kl_coef: float = setting(0.01, f"Coefficient of the k3 KL to the reference. {read_by('kl_coef')}")
    weight_decay: float = setting(0.01, "AdamW weight decay.")
    adam_beta1: float = setting(0.9, "AdamW β1.")
    adam_beta2: float = setting(0.999, "AdamW β2.")
    adam_eps: float = setting(1e-8, "AdamW ε (torch's default).")
    grad_clip: float = setting(1.0, "Clip the global gradient norm to this.")
    micro_batch_size: int | None = setting(
        None, "Responses per forward/backward pass, a multiple of m [default: the whole minibatch]."
    )
    forward_tokens: int = setting(
        FORWARD_TOKENS,
        "Prompt + response positions per decoder forward inside a pass (padded ones count with "
        "--no-packing).",
    )
    no_packing: bool = setting(
        False,
        "Run each pass's rows as length-sorted padded forwards instead of packed padding-free ones "
        "(per-document attention; models whose attention cannot be packed are padded anyway).",
    )
    fsdp: bool = setting(
        False, "With several processes: shard the model with FSDP2 instead of replicating it with DDP (GPUs)."
    )
    log_every: int = setting(1, "Log metrics every N updates (block ESS at every block end regardless).")
    ess_block: int = setting(8, "Updates per block of the block-level sequence ESS (paper: 8 minibatches).")
    probe_groups: int = setting(
        8,
        "Pool groups of the fixed probe on which each evaluated checkpoint's drift from π0 (probe/k3, "
        "probe/log_ratio) is measured: the pool's first mixed groups (0 = no probe).",
    )
    save_every: int | None = setting(None, "Checkpoint every N updates (and always at the end).")
    out: Path | None = setting(None, "Run folder [default: runs/<pool name>/<method>-s<seed>].")
    threads: int | None = setting(None, "CPU threads for torch [default: torch's].")
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
    eval_every: int | None = setting(
        None,
        "Evaluate at update 0, every N updates and at the end with ggpo eval's protocol on the saved "
        "checkpoint (the pool's sampling settings and dtype) [default: no evaluation].",
    )
    eval_datasets: tuple[str, ...] = setting(
        VALIDATION_DATASETS,
        "Validation benchmark of the in-training evaluation, which selects the reported checkpoint, as ggpo "
        "eval --dataset (repeatable); a test split is refused.",
        flag="eval-dataset",
        repeat=True,
    )
    test_datasets: tuple[str, ...] = setting(
        TEST_DATASETS,
        "Held-out benchmark evaluated once, after training, on the checkpoint with the best validation "
        "mean@n and on the final one (repeatable; needs --eval-every).",
        flag="test-dataset",
        repeat=True,
    )
    test_num_problems: int | None = setting(
        None,
        "Problems per test benchmark (arith: drawn; files: the first N rows) [default: --eval-num-problems].",
    )
    no_test: bool = setting(
        False,
        "Skip the end-of-run test evaluation (tuning runs choose on validation and never look at test).",
    )
    allow_test_eval: bool = setting(
        False,
        "Let --eval-dataset name a test split (arith:test). The in-training evaluation chooses the reported "
        "checkpoint, so by default it may not see test.",
    )
    eval_n: int = setting(32, "Responses sampled per evaluation problem (paper: 32).")
    eval_ks: tuple[int, ...] = setting(
        DEFAULT_KS,
        "Comma-separated k of the logged pass@k (those above --eval-n are skipped).",
        flag="eval-k",
    )
    eval_num_problems: int | None = setting(
        None, "Problems per evaluation benchmark (arith: drawn; files: the first N rows) [default: all]."
    )
    eval_engine: EngineName = setting("vllm", "Evaluation engine: vllm or hf.")
    eval_seed: int = setting(
        0, "Evaluation sampling seed, the same at every update (only the weights change)."
    )
    eval_gpu_memory_fraction: float = setting(
        0.3, "On a GPU, the share of its memory the evaluation's vLLM engine may take beside the learner."
    )

    def __post_init__(self) -> None:
        if self.ref_refresh == METHOD_DEFAULT:
            refreshes = self.method in LEARNERS and self.learner.refreshes_reference
            default = PAPER_REF_REFRESH if refreshes else None
            object.__setattr__(self, "ref_refresh", default)
        check_choices(self)

    @property
    def learner(self) -> Learner:
        """The registry's record of ``method`` (`UnknownMethod`, a UserError, for one it does not hold)."""
        return learner(self.method)

    @property
    def run_name(self) -> str:
        return f"{self.method}-s{self.seed}"

    @property
    def run_dir(self) -> Path:
        return self.out if self.out is not None else Path("runs") / Path(self.pool).stem / self.run_name

    def to_dict(self) -> dict:
        """JSON-ready values (paths as strings, tuples as lists), as stored in config.json."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


@dataclass(frozen=True)
class ScoreConfig:
    """What ``ggpo pool score`` scores the pool under (the π0 cache every run shares)."""

    model: str | None = setting(None, "Initial policy folder [default: the pool's model].")


PRESETS: dict[str, dict] = {
    # SPEC.md "Paper defaults" (offline): β 0.01, m 8, G 32, U 400, lr 1e-6, T_ref 160.
    "paper-offline": {},
    # The embedded model and default pool, under rules fixed before any learner was compared on test
    # (docs/results.md "How the presets were chosen"): each learner's learning rate chosen on validation
    # (TUNED_LR; until the prompt-dependent organism every learner reused the GRPO baseline's, the paper's
    # rule, under which most learners collapsed on it, docs/tuning); T_ref is the paper's 160/400 of the
    # run; U is set by the time budget of `make demo` (<= 12 min on 2 cores, pool included); the evaluation
    # sizes and points are compute budgets (validation 128 problems x 8 at every evaluation, every 10
    # updates in `tiny` since the organism's long responses; test 128 x 8 in `tiny` (256 before them),
    # 256 x 8 in `arc` (500 before them), once per run at the end). Nothing was chosen on test.
    "tiny": {
        "groups_per_batch": 8,
        "updates": 20,
        "eval_every": 10,
        "lr": TUNED_LR,
        "ref_refresh": 8,
        "ess_block": 8,
        "eval_n": 8,
        "eval_num_problems": 128,
        "test_num_problems": 128,
    },
    # `make arc`: the same rule on a run three times as long, to pass the methods' peaks (the paper's
    # 400-update shape); evaluated at 7 points (11 before the organism's long responses made each
    # evaluation three times as slow).
    "arc": {
        "groups_per_batch": 8,
        "updates": 60,
        "eval_every": 10,
        "lr": TUNED_LR,
        "ref_refresh": 24,
        "ess_block": 8,
        "eval_n": 8,
        "eval_num_problems": 128,
        "test_num_problems": 256,
    },
}


def resolve_config(preset: str | None = None, config_file: Path | None = None, **overrides) -> TrainConfig:
    """Defaults < preset < config file < flags (``None`` flags are not given)."""
    return config_for(preset, given_settings(config_file, overrides))


def given_settings(config_file: Path | None, flags: dict) -> dict:
    """The settings the user gave: the config file's, overridden by the flags (``None``: not given)."""
    chosen = load_config_file(TrainConfig, config_file) if config_file is not None else {}
    chosen.update(normalize(TrainConfig, {k: v for k, v in flags.items() if v is not None}, "flags"))
    return chosen


def config_for(preset: str | None, chosen: dict) -> TrainConfig:
    """The preset's settings under the user's ``chosen`` ones, validated.

    A learner-specific setting the chosen learner does not read is refused when the user gave it and dropped
    when the preset did. A preset's T_ref tunes the learners that refresh by default: GRPO and GRPO+TIS keep
    π0 as their reference unless the user sets ``ref_refresh``."""
    if preset is not None and preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    preset_values = PRESETS.get(preset or "paper-offline", {})
    method = learner(chosen.get("method", preset_values.get("method", TrainConfig.method)))
    values = {
        name: value.of(method.ablates or method.name) if isinstance(value, PerLearner) else value
        for name, value in preset_values.items()
    }
    refuse_unread(chosen, (method,))
    if not method.refreshes_reference:
        values.pop("ref_refresh", None)
    config = TrainConfig(**{**method.keep_read(values), **chosen})
    validate_config(config)
    return config


def refuse_unread(chosen: dict, methods: tuple[Learner, ...]) -> None:
    """Refuse a learner-specific setting in ``chosen`` that none of ``methods`` reads, with one line naming
    the learners that read it."""
    for name in chosen:
        if name in LEARNER_SETTINGS and not any(method.reads(name) for method in methods):
            raise UserError(
                f"--{flag_name(TrainConfig, name)} is not read by {', '.join(m.name for m in methods)}; "
                f"it is read by {named(readers(name))}"
            )


def validate_config(config: TrainConfig) -> None:
    """Check choices and ranges once, with one clear line for the first problem."""
    checks = [
        (config.updates >= 1, f"--updates must be >= 1, got {config.updates}"),
        (config.groups_per_batch >= 1, f"--groups-per-batch must be >= 1, got {config.groups_per_batch}"),
        (config.lr > 0, f"--lr must be > 0, got {config.lr}"),
        *_learner_checks(config),
        (config.log_every >= 1, f"--log-every must be >= 1, got {config.log_every}"),
        (config.ess_block >= 1, f"--ess-block must be >= 1, got {config.ess_block}"),
        (config.probe_groups >= 0, f"--probe-groups must be >= 0, got {config.probe_groups}"),
        (config.save_every is None or config.save_every >= 1, "--save-every must be >= 1"),
        (config.micro_batch_size is None or config.micro_batch_size >= 1, "--micro-batch-size must be >= 1"),
        (config.forward_tokens >= 1, f"--forward-tokens must be >= 1, got {config.forward_tokens}"),
        (config.threads is None or config.threads >= 1, "--threads must be >= 1"),
        (config.eval_every is None or config.eval_every >= 1, "--eval-every must be >= 1"),
        (config.eval_n >= 1, f"--eval-n must be >= 1, got {config.eval_n}"),
        (0 < config.eval_gpu_memory_fraction < 1, "eval_gpu_memory_fraction must be between 0 and 1"),
        (all(k >= 1 for k in config.eval_ks), "--eval-k values must be >= 1"),
        (
            config.eval_num_problems is None or config.eval_num_problems >= 1,
            "--eval-num-problems must be >= 1",
        ),
        (
            config.test_num_problems is None or config.test_num_problems >= 1,
            "--test-num-problems must be >= 1",
        ),
        *_held_out_checks(config),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def _held_out_checks(config: TrainConfig) -> list[tuple[bool, str]]:
    """The test split stays out of what chooses: the in-training evaluation selects the checkpoint."""
    on_test = [
        spec for spec in config.eval_datasets if spec in HELD_OUT_SPLITS or spec in config.test_datasets
    ]
    return [
        (
            config.allow_test_eval or not on_test,
            f"--eval-dataset {on_test[0] if on_test else ''}: the in-training evaluation selects the "
            "reported checkpoint, so it must not see the test split; use arith:validation (test is "
            "evaluated once at the end, --test-dataset) or pass --allow-test-eval",
        ),
        (
            len(set(config.test_datasets)) == len(config.test_datasets),
            "a --test-dataset is given twice",
        ),
    ]


def _learner_checks(config: TrainConfig) -> list[tuple[bool, str]]:
    """The ranges of the learner-specific settings the method reads (one it does not read is never used);
    β's range differs by learner (the registry's bounds)."""
    method = config.learner  # an unknown method is the first problem reported
    ranges = {
        "ref_refresh": (
            config.ref_refresh is None or config.ref_refresh >= 1,
            "--ref-refresh must be >= 1 or 'never'",
        ),
        "tis_block": (config.tis_block >= 1, f"--tis-block must be >= 1, got {config.tis_block}"),
        "horizon": (config.horizon is None or config.horizon >= 0, "--horizon must be >= 0 or 'full'"),
        "cost_bound": (config.cost_bound > 0, f"--cost-bound must be > 0, got {config.cost_bound}"),
        "push_bound": (config.push_bound > 0, f"--push-bound must be > 0, got {config.push_bound}"),
        "cispo_low": (
            0 <= config.cispo_low <= config.cispo_high,
            f"CISPO needs 0 <= --cispo-low <= --cispo-high, got {config.cispo_low}, {config.cispo_high}",
        ),
    }
    for name, bound in method.bounds.items():
        value = getattr(config, name)
        flag = flag_name(TrainConfig, name)
        ranges[name] = (bound.admits(value), f"--{flag} must be {bound} for {method.name}, got {value}")
    # A config built directly (not by resolve_config) may still ask a learner without π_ref to refresh one.
    no_reference = (
        config.ref_refresh is None or method.reads("ref_refresh"),
        f"--ref-refresh: {method.name} has no reference to refresh",
    )
    return [check for name, check in ranges.items() if method.reads(name)] + [no_reference]
