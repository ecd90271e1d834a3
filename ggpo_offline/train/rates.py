"""The learning rates chosen on validation for each learner, which the tiny and arc presets use."""

from dataclasses import dataclass


@dataclass(frozen=True)
class PerLearner:
    """A preset's value chosen for each learner (``make tune-lr`` and ``make tune-corrections`` choose the
    learning rates); ``default`` for a learner outside the choice."""

    chosen: dict[str, float]
    default: float

    def of(self, method: str) -> float:
        return self.chosen.get(method, self.default)

    def __str__(self) -> str:  # as the flags' help shows it
        return f"per learner (docs/tuning, docs/corrections/tuning), else {self.default:g}"


TUNED_LR = PerLearner(
    # `make tune-lr` (docs/tuning): each learner's rate from 3e-5, 1e-4, 3e-4 by its validation mean@2 at the
    # selected checkpoints, mean over seeds 42, 1234, 2027, the tiny preset on the default pool: the higher
    # mean, not a resolved difference (none of the ten is, after Holm). A learner outside the sweep gets the
    # GRPO baseline's rate (the paper's rule, which every learner followed before this organism).
    chosen={
        "ggpo": 1e-4,
        "agro": 1e-4,
        "grpo": 3e-4,
        "grpo-tis": 1e-4,
        "proximal-kl": 1e-4,
        "pg": 1e-4,
        "cispo": 1e-4,
        "seq-is": 1e-4,
        "is-free": 1e-4,
        "rft": 3e-4,
        # `make tune-corrections` (docs/corrections/tuning), the same rule for `make corrections`' presets;
        # verl-decoupled-geo-rs and areal-m2po re-tuned when their normaliser changed (its rerun-2026-12-06).
        "verl-decoupled-token-is": 1e-4,
        "verl-decoupled-seq-is": 3e-4,
        "verl-decoupled-geo-rs": 1e-4,
        "verl-bypass-ppo-clip": 3e-4,
        "verl-bypass-pg-is": 1e-4,
        "trl-sequence-mask": 1e-4,
        "trl-cispo": 1e-4,
        "openrlhf-icepop": 1e-4,
        "prime-rl": 1e-4,
        "verl-gspo": 1e-4,
        "verl-sapo": 1e-4,
        "roll-topr": 1e-4,
        "areal-m2po": 1e-4,
    },  # fmt: skip
    default=3e-4,
)
