"""The training configuration: a frozen dataclass, presets, config files and flag overrides."""

import dataclasses
import json
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import tomllib

from ggpo_offline.core.errors import UserError
from ggpo_offline.evaluate.defaults import DEFAULT_DATASETS, DEFAULT_KS
from ggpo_offline.train.learners import LEARNERS

FORWARD_TOKENS = 4096
"""Padded (prompt + response) positions per decoder forward: rows are length-sorted and run in forwards of at
most this many positions (a longer row runs alone), each cut to its own longest row, so padding is small."""
PER_RUN = ("pool", "method", "seed", "out")
"""Settings `ggpo compare` chooses for each of its runs (a user gives the others, shared by all runs)."""
PAPER_REF_REFRESH = 160
METHOD_DEFAULT = "method-default"
"""``ref_refresh`` not chosen: resolved on construction to the method's own default (`TrainConfig`)."""


def setting(default, help: str, flag: str | None = None):
    """A TrainConfig field with its help text: the one description that ``ggpo train``'s and ``ggpo
    compare``'s flags (`cli/config_flags.py`) and this file share. ``flag``: the flag's name when it is
    not the field's (``--eval-dataset`` for ``eval_datasets``)."""
    metadata = {"help": help, **({"flag": flag} if flag else {})}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``ggpo train`` needs. Defaults are SPEC.md's paper defaults (offline setting)."""

    pool: Path = setting(Path("pools/base.parquet"), "The pool to replay (a file or a shard directory).")
    method: str = setting("ggpo", f"Learner: {', '.join(LEARNERS)}.")
    model: str | None = setting(None, "Initial policy, a local HF folder [default: the pool's model].")
    seed: int = setting(42, "Seeds the data plan (which groups, in which order) and torch.")
    updates: int = setting(400, "U: optimizer updates; each uses a fresh minibatch, none revisited.")
    groups_per_batch: int = setting(32, "G: groups per minibatch (B = G·m responses).")
    lr: float = setting(1e-6, "AdamW learning rate (constant, no warmup).")
    beta: float = setting(0.01, "β: KL-regularization strength of GGPO, GGPO-clip and AGRO.")
    clip: float = setting(0.05, "GGPO-clip's per-token clip c_clip of the learner-to-reference log ratio.")
    ref_refresh: int | None | Literal["method-default"] = setting(
        METHOD_DEFAULT,
        "T_ref: π_ref ← π_θ every N updates, or 'never' [default: 160 for learners that refresh (ggpo, "
        "ggpo-clip, agro), never for grpo and grpo-tis; a value given applies to every learner].",
    )
    horizon: int | None = setting(
        None,
        "H: tokens of future KL credit of proximal-kl, seq-is and is-free, or 'full' for the whole tail "
        "[default: full] (SPEC-beyond PROVISIONAL).",
    )
    cost_bound: float = setting(
        0.05, "ε_F: bound on each token's KL cost in the future credit (SPEC-beyond PROVISIONAL)."
    )
    cispo_low: float = setting(0.0, "CISPO: lower bound c_lo of the detached token weight.")
    cispo_high: float = setting(
        1.28, "CISPO: upper bound c_hi of the detached token weight (SPEC-beyond PROVISIONAL)."
    )
    tis_block: int = setting(8, "GRPO+TIS: π_old is recomputed at the start of every block of N updates.")
    tis_cap: float = setting(2.0, "GRPO+TIS: cap of the token weight π_old/μ.")
    clip_eps: float = setting(0.2, "GRPO/GRPO+TIS: PPO clip range ε of the token ratio.")
    dual_clip: float = setting(10.0, "GRPO/GRPO+TIS: dual-clip bound c for negative advantages.")
    kl_coef: float = setting(0.01, "GRPO/GRPO+TIS: coefficient of the k3 KL to the reference.")
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
        DEFAULT_DATASETS, "Evaluation benchmark, as ggpo eval --dataset (repeatable).", flag="eval-dataset"
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
    eval_engine: str = setting("vllm", "Evaluation engine: vllm or hf.")
    eval_seed: int = setting(
        0, "Evaluation sampling seed, the same at every update (only the weights change)."
    )
    eval_gpu_memory_fraction: float = setting(
        0.3, "On a GPU, the share of its memory the evaluation's vLLM engine may take beside the learner."
    )

    def __post_init__(self) -> None:
        if self.ref_refresh == METHOD_DEFAULT:
            refreshes = self.method in LEARNERS and LEARNERS[self.method].refreshes_reference
            default = PAPER_REF_REFRESH if refreshes else None
            object.__setattr__(self, "ref_refresh", default)

    @property
    def run_name(self) -> str:
        return f"{self.method}-s{self.seed}"

    @property
    def run_dir(self) -> Path:
        return self.out if self.out is not None else Path("runs") / Path(self.pool).stem / self.run_name

    def to_dict(self) -> dict:
        """JSON-ready values (paths as strings, tuples as lists), as stored in config.json."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


PRESETS: dict[str, dict] = {
    # SPEC.md "Paper defaults" (offline): β 0.01, m 8, G 32, U 400, lr 1e-6, T_ref 160.
    "paper-offline": {},
    # The embedded model and default pool: ~1.3 s per update on 2 CPU cores, so that `make demo` compares
    # four methods on two seeds in minutes, and a small evaluation (64 arith test problems, n = 8) every 10
    # updates. Measured on the default pool (README): lr 1e-4 selects the careful style; 3e-4 breaks its
    # arithmetic; past ~20 updates AGRO and GGPO can collapse (most samples open with no style marker).
    "tiny": {
        "groups_per_batch": 8,
        "updates": 20,
        "eval_every": 10,
        "lr": 1e-4,
        "ref_refresh": 15,
        "ess_block": 6,
        "eval_n": 8,
        "eval_num_problems": 64,
    },
}

_FIELDS = {f.name: f for f in fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


WORDS = {"ref_refresh": "never", "horizon": "full"}
"""Counts whose None is spelled as a word in files and flags."""


def flag_name(name: str) -> str:
    """The flag of a TrainConfig field, without dashes: its own name, or the one its metadata gives."""
    return _FIELDS[name].metadata.get("flag", name.replace("_", "-"))


def _normalize(values: dict, where: str) -> dict:
    """Accept flag-style keys (ref-refresh, eval-dataset) and ``ref_refresh: never``; refuse unknown keys."""
    by_flag = {flag_name(name).replace("-", "_"): name for name in _FIELDS}
    normalized = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        name = by_flag.get(name, name)
        if name not in _FIELDS:
            raise UserError(f"{where}: unknown setting {key!r}")
        if name in WORDS and value in (WORDS[name], "none", None):
            value = None
        elif name in WORDS and isinstance(value, str):  # a flag's text
            if not value.strip().isdigit():
                raise UserError(f"{where}: {name} must be a number or '{WORDS[name]}', got {value!r}")
            value = int(value)
        if name in ("pool", "out") and value is not None:
            value = Path(value)
        normalized[name] = _coerce(name, value, where)
    return normalized


def _coerce(name: str, value, where: str):
    """Numbers and switches from files arrive as whatever the format parsed; check them once here."""
    if typing.get_origin(_HINTS[name]) is tuple:
        return _coerce_tuple(name, value, where)
    kinds = [k for k in typing.get_args(_HINTS[name]) or (_HINTS[name],) if k in (int, float, bool)]
    if value is None or not kinds:
        return value
    if isinstance(value, bool) == (bool in kinds) and isinstance(value, tuple(kinds)):
        return value
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise UserError(f"{where}: {name} must be {kinds[0].__name__}, got {value!r}")


def _coerce_tuple(name: str, value, where: str) -> tuple:
    """A list, or one comma-separated string, of the field's element type."""
    kind = typing.get_args(_HINTS[name])[0]
    items = [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise UserError(f"{where}: {name} must be a non-empty list, got {value!r}")
    try:
        return tuple(kind(item) for item in items)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {name} must be a list of {kind.__name__}, got {value!r}") from None


def load_config_file(path: Path) -> dict:
    """Settings from a TOML or YAML file (keys as field or flag names)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    try:
        if path.suffix == ".toml":
            values = tomllib.loads(path.read_text())
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(path.read_text()) or {}
        elif path.suffix == ".json":
            values = json.loads(path.read_text())
        else:
            raise UserError(f"--config {path}: use a .toml, .yaml or .json file")
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise UserError(f"--config {path}: cannot parse ({str(exc).splitlines()[0]})") from None
    if not isinstance(values, dict):
        raise UserError(f"--config {path}: expected a mapping of settings")
    return _normalize(values, f"--config {path}")


def resolve_config(preset: str | None = None, config_file: Path | None = None, **overrides) -> TrainConfig:
    """Defaults < preset < config file < flags (``None`` flags are not given).

    A preset's T_ref tunes the refreshing learners: GRPO and GRPO+TIS keep their fixed reference unless the
    file or a flag sets ``ref_refresh``."""
    if preset is not None and preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    values = dict(PRESETS.get(preset or "paper-offline", {}))
    chosen = load_config_file(config_file) if config_file is not None else {}
    chosen.update(_normalize({k: v for k, v in overrides.items() if v is not None}, "flags"))
    method = chosen.get("method", values.get("method", TrainConfig.method))
    if method not in LEARNERS or not LEARNERS[method].refreshes_reference:
        values.pop("ref_refresh", None)
    config = TrainConfig(**{**values, **chosen})
    validate_config(config)
    return config


def validate_config(config: TrainConfig) -> None:
    """Check choices and ranges once, with one clear line for the first problem."""
    checks = [
        (config.method in LEARNERS, f"unknown method {config.method!r}; choose one of {', '.join(LEARNERS)}"),
        (config.updates >= 1, f"--updates must be >= 1, got {config.updates}"),
        (config.groups_per_batch >= 1, f"--groups-per-batch must be >= 1, got {config.groups_per_batch}"),
        (config.lr > 0, f"--lr must be > 0, got {config.lr}"),
        (config.beta > 0, f"--beta must be > 0, got {config.beta}"),
        (config.ref_refresh is None or config.ref_refresh >= 1, "--ref-refresh must be >= 1 or 'never'"),
        (config.tis_block >= 1, f"--tis-block must be >= 1, got {config.tis_block}"),
        (config.horizon is None or config.horizon >= 0, "--horizon must be >= 0 or 'full'"),
        (config.cost_bound > 0, f"--cost-bound must be > 0, got {config.cost_bound}"),
        (
            0 <= config.cispo_low <= config.cispo_high,
            f"CISPO needs 0 <= --cispo-low <= --cispo-high, got {config.cispo_low}, {config.cispo_high}",
        ),
        (
            config.ref_refresh is None
            or config.method not in LEARNERS
            or "ref_logp" in LEARNERS[config.method].needs,
            f"--ref-refresh: {config.method} has no reference to refresh",
        ),
        (config.log_every >= 1, f"--log-every must be >= 1, got {config.log_every}"),
        (config.ess_block >= 1, f"--ess-block must be >= 1, got {config.ess_block}"),
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
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
