"""The learner registry: each method as an explicit record that the trainer, CLI, compare and report read."""

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Learner:
    """One method: its loss and everything a trainer or a report must know about it."""

    name: str
    """The --method value."""
    label: str
    """How tables and figures name it."""
    loss_name: str
    """Its loss: the pure function of that name in `ggpo_offline.train.losses` (looked up when used, so that
    reading the registry, e.g. for ``ggpo --help``, does not import torch)."""
    needs: tuple[str, ...]
    """The constant log-probs its loss takes (behavior_logp: μ as stored; old_logp: π_old of a TIS block;
    ref_logp: π_ref); the trainer prepares only these."""
    hyperparameters: tuple[str, ...]
    """Its loss's keyword settings, each a TrainConfig field of the same name (checked by a test)."""
    refreshes_reference: bool
    """True: π_ref ← π_θ every T_ref updates by default (160); False: the initial model stays π_ref unless
    a T_ref is given explicitly."""
    formula: str
    """Where its update is defined (SPEC.md / the paper)."""
    style: dict
    """matplotlib line style of its curves."""
    fixed: dict = field(default_factory=dict)
    """Loss keywords this method fixes (PG: Proximal KL with β = 0), not taken from the config."""

    def loss_kwargs(self, config) -> dict:
        """The keywords its loss takes besides the tensors: its hyperparameters from ``config`` (a
        TrainConfig) and what the method fixes."""
        return {**{name: getattr(config, name) for name in self.hyperparameters}, **self.fixed}

    @property
    def loss(self) -> Callable:
        from ggpo_offline.train import losses

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
    Learner(
        name="proximal-kl", label="Proximal KL", loss_name="proximal_kl_loss",
        needs=("behavior_logp", "ref_logp"), hyperparameters=("beta", "horizon", "cost_bound"),
        refreshes_reference=True,
        formula="SPEC-beyond §1; PKL paper Sec. 4, Eq. 5–7",
        style={"color": "#8c564b", "linestyle": "-"},
    ),
    Learner(
        name="pg", label="PG", loss_name="proximal_kl_loss",
        needs=("behavior_logp",), hyperparameters=(), fixed={"beta": 0.0}, refreshes_reference=False,
        formula="SPEC-beyond §1 with β = 0 (κ = w·Â)",
        style={"color": "#7f7f7f", "linestyle": "--"},
    ),
    Learner(
        name="cispo", label="CISPO", loss_name="cispo_loss",
        needs=("behavior_logp",), hyperparameters=("cispo_low", "cispo_high"), refreshes_reference=False,
        formula="SPEC-beyond §2; MiniMax-M1 Eq. 4–5",
        style={"color": "#e377c2", "linestyle": "-"},
    ),
    Learner(
        name="seq-is", label="seq-IS", loss_name="seq_is_loss",
        needs=("behavior_logp", "ref_logp"), hyperparameters=("beta", "horizon", "cost_bound"),
        refreshes_reference=True,
        formula="SPEC-beyond §3; PKL paper Eq. 11 (GSPO-token)",
        style={"color": "#bcbd22", "linestyle": "-."},
    ),
    Learner(
        name="is-free", label="IS-free", loss_name="is_free_loss",
        needs=("ref_logp",), hyperparameters=("beta", "horizon", "cost_bound"),
        refreshes_reference=True,
        formula="SPEC-beyond §4; PKL paper Eq. 12",
        style={"color": "#17becf", "linestyle": "-."},
    ),
    Learner(
        name="ggpo-reward-only", label="GGPO reward-only", loss_name="ggpo_reward_only_loss",
        needs=(), hyperparameters=("beta",), refreshes_reference=False,
        formula="SPEC-beyond §5; GGPO paper App. D.6",
        style={"color": "#1f77b4", "linestyle": ":"},
    ),
    Learner(
        name="rft", label="RFT", loss_name="rft_loss",
        needs=(), hyperparameters=(), refreshes_reference=False,
        formula="rejection-sampling fine-tuning: NLL of the correct responses (this toolkit's control)",
        style={"color": "#000000", "linestyle": ":"},
    ),
)  # fmt: skip
LEARNERS: dict[str, Learner] = {learner.name: learner for learner in REGISTRY}
METHODS: tuple[str, ...] = tuple(LEARNERS)


def learner(method: str) -> Learner:
    """The registry's record of ``method``; ValueError naming the choices for an unknown one."""
    if method not in LEARNERS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(LEARNERS)}")
    return LEARNERS[method]
