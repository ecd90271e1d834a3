"""Training presets (paper-offline, tiny, arc) and how a run's `TrainConfig` is resolved from one: defaults <
training preset < config file < flags."""

from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import construct, flag_name, load_config_file, normalize
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.learners import SETTINGS as LEARNER_SETTINGS
from ggpo_offline.train.learners import TUNED_LR, Learner, PerLearner, learner, named, readers

PRESETS: dict[str, dict] = {
    # SPEC.md "Paper defaults" (offline): β 0.01, m 8, G 32, U 400, lr 1e-6, T_ref 160.
    "paper-offline": {},
    # The embedded model and default pool, under rules fixed before any learner was compared on test
    # (docs/results.md "Presets"): each learner's learning rate chosen on validation (TUNED_LR,
    # docs/tuning); T_ref is the paper's 160/400 of the run; U is set by the time budget of `make demo`
    # (<= 12 min on 2 cores, pool included); the evaluation sizes and points are compute budgets
    # (validation 128 problems x 8 every 10 updates; test 128 x 8, once per run at the end). Nothing was
    # chosen on test.
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
    # `make arc`: the same rules on a run three times as long, to pass the methods' peaks (the paper's
    # 400-update shape), evaluated at 7 points; test 256 x 8.
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
"""The training presets by name: settings by `TrainConfig` setting name (a `PerLearner` value is resolved
for the run's learner)."""


def resolve_config(preset: str | None = None, config_file: Path | None = None, **overrides) -> TrainConfig:
    """Defaults < training preset < config file < flags (``None`` flags are not given)."""
    return config_for(preset, given_settings(config_file, overrides))


def given_settings(config_file: Path | None, flags: dict) -> dict:
    """The settings the user gave: the config file's, overridden by the flags (``None``: not given)."""
    chosen = load_config_file(TrainConfig, config_file) if config_file is not None else {}
    chosen.update(normalize(TrainConfig, {k: v for k, v in flags.items() if v is not None}, "flags"))
    return chosen


def config_for(preset: str | None, chosen: dict) -> TrainConfig:
    """The training preset's settings under the user's ``chosen`` ones (`TrainConfig` checks the result).

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
    return construct(TrainConfig, {**method.keep_read(values), **chosen})


def refuse_unread(chosen: dict, methods: tuple[Learner, ...]) -> None:
    """Refuse a learner-specific setting in ``chosen`` that none of ``methods`` reads, with one line naming
    the learners that read it."""
    for name in chosen:
        if name in LEARNER_SETTINGS and not any(method.reads(name) for method in methods):
            raise UserError(
                f"--{flag_name(TrainConfig, name)} is not read by {', '.join(m.name for m in methods)}; "
                f"it is read by {named(readers(name))}"
            )
