"""The learner registry: each method as an explicit record that the trainer, CLI, compare and report read."""

from collections.abc import Callable
from dataclasses import dataclass

ANCHORS = ("behavior_logp", "old_logp", "ref_logp")
"""The constant log-prob inputs a loss can take besides logp: μ (stored), π_old (TIS blocks), π_ref."""


@dataclass(frozen=True)
class Learner:
    """One method: its loss and everything a trainer or a report must know about it."""

    name: str
    """The --method value."""
    label: str
    """How tables and figures name it."""
    loss_name: str
    """Its loss: the pure function of that name in `ggpo_offline.losses` (looked up when used, so that
    reading the registry, e.g. for ``ggpo --help``, does not import torch)."""
    needs: tuple[str, ...]
    """The constant log-probs its loss takes (of ANCHORS); the trainer prepares only these."""
    hyperparameters: tuple[str, ...]
    """Its loss's keyword settings, each a TrainConfig field of the same name (checked by a test)."""
    refreshes_reference: bool
    """True: π_ref ← π_θ every T_ref updates by default (160); False: the initial model stays π_ref unless
    a T_ref is given explicitly."""
    formula: str
    """Where its update is defined (SPEC.md / the paper)."""
    style: dict
    """matplotlib line style of its curves."""

    @property
    def loss(self) -> Callable:
        from ggpo_offline import losses

        return getattr(losses, self.loss_name)


# Colours: the paper's Figure 4 (GRPO orange, GRPO+TIS purple dashed, AGRO green, GGPO blue).
REGISTRY: tuple[Learner, ...] = (
    Learner(
        name="ggpo", label="GGPO", loss_name="ggpo_loss",
        needs=("ref_logp",), hyperparameters=("beta",), refreshes_reference=True,
        formula="SPEC.md GGPO; paper Eq. 6, 11, Algorithm 1",
        style={"color": "#1f77b4", "linestyle": "-"},
    ),
    Learner(
        name="ggpo-clip", label="GGPO-clip", loss_name="ggpo_clip_loss",
        needs=("ref_logp",), hyperparameters=("beta", "clip"), refreshes_reference=True,
        formula="SPEC.md GGPO-clip; paper Eq. 12, 63–65",
        style={"color": "#d62728", "linestyle": "-."},
    ),
    Learner(
        name="agro", label="AGRO", loss_name="agro_loss",
        needs=("ref_logp",), hyperparameters=("beta",), refreshes_reference=True,
        formula="SPEC.md AGRO; paper Appendix C.2, Eq. 62",
        style={"color": "#2ca02c", "linestyle": "-"},
    ),
    Learner(
        name="grpo", label="GRPO", loss_name="grpo_loss",
        needs=("behavior_logp", "ref_logp"), hyperparameters=("clip_eps", "dual_clip", "kl_coef"),
        refreshes_reference=False,
        formula="SPEC.md GRPO; paper Appendix C.2",
        style={"color": "#ff7f0e", "linestyle": "-"},
    ),
    Learner(
        name="grpo-tis", label="GRPO+TIS", loss_name="grpo_tis_loss",
        needs=("old_logp", "behavior_logp", "ref_logp"),
        hyperparameters=("tis_cap", "clip_eps", "dual_clip", "kl_coef"), refreshes_reference=False,
        formula="SPEC.md GRPO+TIS; paper Appendix C.2, Eq. 61",
        style={"color": "#9467bd", "linestyle": "--"},
    ),
)  # fmt: skip
LEARNERS: dict[str, Learner] = {learner.name: learner for learner in REGISTRY}
METHODS: tuple[str, ...] = tuple(LEARNERS)


def learner(method: str) -> Learner:
    """The registry's record of ``method``; ValueError naming the choices for an unknown one."""
    if method not in LEARNERS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(LEARNERS)}")
    return LEARNERS[method]
