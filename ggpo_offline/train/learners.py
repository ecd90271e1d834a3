"""The learner registry: each method as an explicit record that the trainer, CLI, compare and report read."""

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import Range, above
from ggpo_offline.train.correction_presets import CORRECTION_PRESETS, CorrectionPreset, describe
from ggpo_offline.train.loss_inputs import LossInputs, MinibatchCounts, MinibatchSource

PAPER_REF_REFRESH = 160
"""T_ref of the learners that refresh π_ref by default (SPEC.md's paper default)."""
SCHEDULES = {"ref_logp": "ref_refresh", "old_logp": "tis_block"}
"""The setting that schedules each reference a loss may take: T_ref refreshes π_ref, a TIS block recomputes
π_old (μ, ``behavior_logp``, is the pool's and never changes)."""
SYMBOLS = {"behavior_logp": "μ", "old_logp": "π_old", "ref_logp": "π_ref"}

if TYPE_CHECKING:  # the registry is read without torch (``ggpo --help``)
    from ggpo_offline.train.losses import LossOutput


class UnknownMethod(UserError, ValueError):
    """A --method the registry does not hold: one line for the user, a ValueError to library callers."""


POSITIVE = above(0)
"""β's range where the loss divides by β (its field admits β = 0, which is PG)."""


@dataclass(frozen=True)
class PerLearner:
    """A training preset's value chosen for each learner (``make tune-lr`` and ``make tune-corrections``
    choose the learning rates); ``default`` for a learner outside the choice."""

    chosen: dict[str, float]
    default: float

    def of(self, method: str) -> float:
        return self.chosen.get(method, self.default)

    def __str__(self) -> str:  # as the flags' help shows it
        return f"per learner (docs/tuning, docs/corrections/tuning), else {self.default:g}"


@dataclass(frozen=True)
class Learner:
    """One method: its loss and everything a trainer or a report must know about it."""

    name: str
    """The --method value."""
    label: str
    """How tables and figures name it."""
    summary: str
    """What its update does, in one line."""
    loss_name: str
    """Its loss: the pure function of that name in `ggpo_offline.train.losses` (looked up when used, so that
    reading the registry, e.g. for ``ggpo --help``, does not import torch)."""
    needs: tuple[str, ...]
    """The constant log-probs its loss takes (behavior_logp: μ as stored; old_logp: π_old of a TIS block;
    ref_logp: π_ref); the trainer prepares only these, and each one's schedule (`SCHEDULES`) is a setting it
    reads."""
    hyperparameters: tuple[str, ...]
    """Its loss's keyword settings, each a TrainConfig field of the same name (checked by a test)."""
    refreshes_reference: bool
    """True: π_ref ← π_θ every T_ref updates by default (160, or the preset's); False: the initial model stays
    π_ref unless a T_ref is given explicitly."""
    formula: str
    """Where its update is defined (SPEC.md / the paper)."""
    style: dict
    """matplotlib line style of its curves."""
    fixed: dict = field(default_factory=dict)
    """Loss keywords this method fixes (PG: Proximal KL with β = 0), not taken from the config."""
    bounds: dict[str, Range] = field(default_factory=dict)
    """The range of each hyperparameter that this learner narrows from its field's (β > 0 where the loss
    divides by β; the field admits β = 0, which is PG)."""
    ablates: str | None = None
    """The learner this one is an ablation of (an experiment's arm, not a method to choose): it takes that
    learner's preset values (its tuned rate), and its row is in docs/learners.md, not the README's table."""
    correction_preset: CorrectionPreset | None = None
    """A framework's rollout correction (`ggpo_offline.train.correction_presets`): its loss also takes the
    minibatch's response count, for the per-sequence aggregations."""
    tuned_lr: float | None = None
    """Its learning rate chosen on validation (`TUNED_LR`); None: not tuned, the default's."""

    @property
    def settings(self) -> tuple[str, ...]:
        """The TrainConfig fields it reads: its hyperparameters and each needed reference's schedule."""
        return self.hyperparameters + tuple(SCHEDULES[need] for need in self.needs if need in SCHEDULES)

    def reads(self, setting: str) -> bool:
        return setting in self.settings

    def keep_read(self, values: dict) -> dict:
        """``values`` without the learner-specific settings this learner does not read."""
        return {name: value for name, value in values.items() if name not in SETTINGS or self.reads(name)}

    def loss_kwargs(self, config) -> dict:
        """The keywords its loss takes besides the tensors: its hyperparameters from ``config`` (a
        TrainConfig) and what the method fixes."""
        return {**{name: getattr(config, name) for name in self.hyperparameters}, **self.fixed}

    @property
    def loss(self) -> Callable:
        from ggpo_offline.train import losses

        return getattr(losses, self.loss_name)

    def prepare(self, minibatch: MinibatchSource) -> MinibatchCounts:
        """What every micro-batch's loss divides by, counted over the whole minibatch before its first
        micro-batch's loss: T_tok, and a correction preset's own counts (`prepared_counts`)."""
        if self.correction_preset is None:
            return MinibatchCounts(minibatch.token_count)
        from ggpo_offline.train.losses.composed import prepared_counts

        counts = prepared_counts(self.correction_preset.correction, minibatch)
        return MinibatchCounts(minibatch.token_count, **counts)

    def loss_on(self, inputs: LossInputs, settings: dict) -> "LossOutput":
        """Its loss on one micro-batch: ``inputs`` as its loss takes them (`LossInputs.arguments`), and
        ``settings`` (`loss_kwargs`)."""
        return self.loss(**inputs.arguments(self.needs), **settings)


# Colours: the paper's Figure 4 (GRPO orange, GRPO+TIS purple dashed, AGRO green, GGPO blue).
# Bounds: GGPO, GGPO-clip, AGRO, GGPO reward-only and bounded push divide by β; the Proximal KL family is PG
# at β = 0.
REGISTRY: tuple[Learner, ...] = (
    Learner(
        name="ggpo", label="GGPO", summary="group log-mean-exp of KL-adjusted rewards",
        loss_name="ggpo_loss",
        needs=("ref_logp",), hyperparameters=("beta",), bounds={"beta": POSITIVE}, refreshes_reference=True,
        formula="SPEC.md GGPO; paper Eq. 6, 11, Algorithm 1",
        style={"color": "#1f77b4", "linestyle": "-"},
        tuned_lr=1e-4,
    ),
    Learner(
        name="ggpo-clip", label="GGPO-clip", summary="GGPO with token-clipped coefficients",
        loss_name="ggpo_clip_loss",
        needs=("ref_logp",), hyperparameters=("beta", "clip"), bounds={"beta": POSITIVE},
        refreshes_reference=True,
        formula="SPEC.md GGPO-clip; paper Eq. 12, 63–65",
        style={"color": "#d62728", "linestyle": "-."},
    ),
    Learner(
        name="agro", label="AGRO", summary="leave-one-out KL-adjusted advantage",
        loss_name="agro_loss",
        needs=("ref_logp",), hyperparameters=("beta",), bounds={"beta": POSITIVE}, refreshes_reference=True,
        formula="SPEC.md AGRO; paper Appendix C.2, Eq. 62",
        style={"color": "#2ca02c", "linestyle": "-"},
        tuned_lr=1e-4,
    ),
    Learner(
        name="grpo", label="GRPO", summary="PPO dual-clip on π_θ/μ + k3 KL to π_ref",
        loss_name="grpo_loss",
        needs=("behavior_logp", "ref_logp"), hyperparameters=("clip_eps", "dual_clip", "kl_coef"),
        refreshes_reference=False,
        formula="SPEC.md GRPO; paper Appendix C.2",
        style={"color": "#ff7f0e", "linestyle": "-"},
        tuned_lr=3e-4,
    ),
    Learner(
        name="grpo-tis", label="GRPO+TIS", summary="PPO against π_old × capped π_old/μ",
        loss_name="grpo_tis_loss",
        needs=("old_logp", "behavior_logp", "ref_logp"),
        hyperparameters=("tis_cap", "clip_eps", "dual_clip", "kl_coef"), refreshes_reference=False,
        formula="SPEC.md GRPO+TIS; paper Appendix C.2, Eq. 61",
        style={"color": "#9467bd", "linestyle": "--"},
        tuned_lr=1e-4,
    ),
    Learner(
        name="proximal-kl", label="Proximal KL",
        summary="κ = w·(Â − C): token IS + windowed future KL credit",
        loss_name="proximal_kl_loss",
        needs=("behavior_logp", "ref_logp"), hyperparameters=("beta", "horizon", "cost_bound"),
        refreshes_reference=True,
        formula="SPEC-beyond §1; PKL paper Sec. 4, Eq. 5–7",
        style={"color": "#8c564b", "linestyle": "-"},
        tuned_lr=1e-4,
    ),
    Learner(
        name="pg", label="PG", summary="Proximal KL with β = 0: κ = w·Â",
        loss_name="proximal_kl_loss",
        needs=("behavior_logp",), hyperparameters=(), fixed={"beta": 0.0}, refreshes_reference=False,
        formula="SPEC-beyond §1 with β = 0 (κ = w·Â)",
        style={"color": "#7f7f7f", "linestyle": "--"},
        tuned_lr=1e-4,
    ),
    Learner(
        name="cispo", label="CISPO", summary="κ = clip(w, c_lo, c_hi)·Â",
        loss_name="cispo_loss",
        needs=("behavior_logp",), hyperparameters=("cispo_low", "cispo_high"), refreshes_reference=False,
        formula="SPEC-beyond §2; MiniMax-M1 Eq. 4–5",
        style={"color": "#e377c2", "linestyle": "-"},
        tuned_lr=1e-4,
    ),
    Learner(
        name="seq-is", label="seq-IS", summary="Proximal KL with the geometric-mean sequence weight",
        loss_name="seq_is_loss",
        needs=("behavior_logp", "ref_logp"), hyperparameters=("beta", "horizon", "cost_bound"),
        refreshes_reference=True,
        formula="SPEC-beyond §3; PKL paper Eq. 11 (GSPO-token)",
        style={"color": "#bcbd22", "linestyle": "-."},
        tuned_lr=1e-4,
    ),
    Learner(
        name="is-free", label="IS-free", summary="κ = Â − C, no importance weight",
        loss_name="is_free_loss",
        needs=("ref_logp",), hyperparameters=("beta", "horizon", "cost_bound"),
        refreshes_reference=True,
        formula="SPEC-beyond §4; PKL paper Eq. 12",
        style={"color": "#17becf", "linestyle": "-."},
        tuned_lr=1e-4,
    ),
    Learner(
        name="ggpo-reward-only", label="GGPO reward-only",
        summary="GGPO coefficients from softmax(r/β) alone", loss_name="ggpo_reward_only_loss",
        needs=(), hyperparameters=("beta",), bounds={"beta": POSITIVE}, refreshes_reference=False,
        formula="SPEC-beyond §5; GGPO paper App. D.6",
        style={"color": "#1f77b4", "linestyle": ":"},
    ),
    Learner(
        name="ggpo-bounded-push", label="GGPO bounded push",
        summary="ablation: GGPO, no push on a wrong response B nats below π_ref",
        loss_name="ggpo_bounded_push_loss",
        needs=("ref_logp",), hyperparameters=("beta", "push_bound"), bounds={"beta": POSITIVE},
        refreshes_reference=True, ablates="ggpo",
        formula="docs/learners.md \"An ablation\"; GGPO's c_i (paper Eq. 9) cut",
        style={"color": "#1f77b4", "linestyle": "--"},
    ),
    Learner(
        name="rft", label="RFT", summary="NLL of the minibatch's correct responses",
        loss_name="rft_loss",
        needs=(), hyperparameters=(), refreshes_reference=False,
        formula="rejection-sampling fine-tuning: NLL of the correct responses (this toolkit's control)",
        style={"color": "#000000", "linestyle": ":"},
        tuned_lr=3e-4,
    ),
)  # fmt: skip


def _correction_learner(preset: CorrectionPreset, position: int) -> Learner:
    """A framework preset as a learner: its parts fixed (framework defaults), only π_old's schedule read."""
    correction = preset.correction
    return Learner(
        name=preset.name, label=preset.name, summary=describe(correction), loss_name="corrected_loss",
        needs=("behavior_logp",) if correction.bypass else ("old_logp", "behavior_logp"), hyperparameters=(),
        refreshes_reference=False,
        formula=f"SPEC-corrections §{preset.section}; {preset.framework} {preset.knobs}",
        style={"color": f"C{position % 10}", "linestyle": ("-", "--", "-.", ":")[position // 10 % 4]},
        fixed={"correction": correction}, correction_preset=preset, tuned_lr=preset.tuned_lr,
    )  # fmt: skip


CORRECTIONS: tuple[Learner, ...] = tuple(
    _correction_learner(preset, i) for i, preset in enumerate(CORRECTION_PRESETS)
)
"""Every framework's rollout correction as a learner (docs/corrections.md); REGISTRY holds the others."""
LEARNERS: dict[str, Learner] = {learner.name: learner for learner in REGISTRY + CORRECTIONS}
METHODS: tuple[str, ...] = tuple(learner.name for learner in REGISTRY)
"""The toolkit's own learners; every --method is one of these or a framework preset (`CORRECTIONS`)."""
SETTINGS: tuple[str, ...] = tuple(
    dict.fromkeys(name for learner in LEARNERS.values() for name in learner.settings)
)
"""The learner-specific settings: every learner's hyperparameters and reference schedules. A learner
refuses those it does not read (`ggpo_offline.train.training_presets`)."""
TUNED_LR = PerLearner(
    chosen={entry.name: entry.tuned_lr for entry in LEARNERS.values() if entry.tuned_lr is not None},
    default=3e-4,
)
"""The rates of the tiny and arc presets. `make tune-lr` (docs/tuning) and `make tune-corrections`
(docs/corrections/tuning) choose each learner's ``tuned_lr`` from 3e-5, 1e-4, 3e-4 by its validation mean@2
at the selected checkpoints, mean over seeds 42, 1234, 2027, the tiny preset on the default pool: the higher
mean, not a resolved difference (none of the ten core learners' is, after Holm). A learner outside the sweeps
gets the GRPO baseline's rate, the paper's rule."""


def learner(method: str) -> Learner:
    """The registry's record of ``method``; `UnknownMethod` naming the choices for an unknown one."""
    if method not in LEARNERS:
        close = difflib.get_close_matches(method, LEARNERS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownMethod(
            f"unknown method {method!r}; choose from {', '.join(METHODS)} or a framework preset "
            f"(docs/corrections.md){hint}"
        )
    return LEARNERS[method]


def readers(setting: str) -> tuple[str, ...]:
    """The learners that read ``setting``, in registry order."""
    return tuple(name for name, entry in LEARNERS.items() if entry.reads(setting))


def named(names: tuple[str, ...] | list[str]) -> str:
    """Learner names for one line: the framework presets among them counted, not listed."""
    own = [name for name in names if LEARNERS[name].correction_preset is None]
    presets = len(names) - len(own)
    counted = [f"{presets} framework presets (docs/corrections.md)"] if presets else []
    return ", ".join(own + counted)


def read_by(setting: str) -> str:
    """The "Read by ..." sentence of a learner-specific setting's help, with each learner's range where it
    differs by learner: "Read by ggpo, agro (> 0); proximal-kl (>= 0)."."""
    groups: dict[str, list[str]] = {}
    for entry in LEARNERS.values():
        if entry.reads(setting):
            bound = entry.bounds.get(setting)
            groups.setdefault(f" ({bound})" if bound else "", []).append(entry.name)
    return "Read by " + "; ".join(named(names) + bound for bound, names in groups.items()) + "."


def ref_refresh_help() -> str:
    """``--ref-refresh``'s help beyond its first clause: each learner's default, and who reads it."""
    refreshing = [entry.name for entry in REGISTRY if entry.refreshes_reference]
    fixed = [e.name for e in REGISTRY if e.reads("ref_refresh") and not e.refreshes_reference]
    without = [entry.name for entry in REGISTRY if not entry.reads("ref_refresh")] + ["the framework presets"]
    return (
        f"[default: {PAPER_REF_REFRESH} (or the preset's) for {', '.join(refreshing)}; never (π0 stays π_ref "
        f"unless a value is given) for {', '.join(fixed)}]. {read_by('ref_refresh')} "
        f"{', '.join(without)} have no reference."
    )
