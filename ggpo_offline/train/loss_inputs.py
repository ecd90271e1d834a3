"""What a learner's loss is given: one micro-batch's tensors and the whole minibatch's counts, as typed
records the trainer fills and `ggpo_offline.train.learners.Learner` passes on (no torch here)."""

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from ggpo_offline.train.minibatch import Minibatch


@dataclass(frozen=True)
class MinibatchCounts:
    """What every micro-batch's loss divides by: the whole minibatch's counts, summed over its micro-batches
    and ranks (the global normalization of `ggpo_offline.train.losses`)."""

    token_count: "Tensor"
    """T_tok, the valid tokens: every learner's."""
    sequence_count: "Tensor | None" = None
    """G, the responses with a token (a correction preset's, SPEC-corrections §f)."""
    response_count: "Tensor | None" = None
    """B, every response (TRL's sequence mean)."""
    kept_token_count: "Tensor | None" = None
    """N of the mask a `count_kept` correction's rejections leave (SPEC-corrections §g)."""
    kept_sequence_count: "Tensor | None" = None
    """G of that mask."""
    weight_total: "Tensor | None" = None
    """The truncated weights' sum a batch-normalised correction divides by (its ``batch_normalize``)."""

    def given(self) -> dict[str, "Tensor"]:
        """The counts this minibatch has, as its learner's loss takes them (a loss takes only its own)."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True)
class LossInputs:
    """What a learner's loss reads of one micro-batch (`ggpo_offline.train.losses`' shape legend)."""

    logp: "Tensor"
    """log π_θ [B, T], with gradient."""
    mask: "Tensor"
    """M [B, T]."""
    rewards: "Tensor"
    """r [B]."""
    group_size: int
    """m."""
    counts: MinibatchCounts
    """The minibatch's normalisers (`Learner.prepare`)."""
    behavior_logp: "Tensor | None" = None
    """log μ, as stored in the pool."""
    old_logp: "Tensor | None" = None
    """log π_old of the current TIS block."""
    ref_logp: "Tensor | None" = None
    """log π_ref."""

    @classmethod
    def of(
        cls, micro: "Minibatch", logp: "Tensor", mask: "Tensor", counts: MinibatchCounts, constants: dict
    ) -> "LossInputs":
        """One micro-batch's inputs: its forward's ``logp``, its ``mask`` and the ``constants`` (by name)
        on the training device; the rewards moved there beside them."""
        return cls(
            logp=logp,
            mask=mask,
            rewards=micro.rewards.to(logp.device),
            group_size=micro.group_size,
            counts=counts,
            **constants,
        )

    def arguments(self, needs: tuple[str, ...]) -> dict:
        """The keywords of a learner's loss (`ggpo_offline.train.losses`): the tensors, the minibatch's
        counts and the constant log-probs the learner ``needs``."""
        given = {"logp": self.logp, "mask": self.mask, "rewards": self.rewards, "group_size": self.group_size}
        return given | self.counts.given() | {need: getattr(self, need) for need in needs}


class MinibatchSource(Protocol):
    """A minibatch as `Learner.prepare` reads it, micro-batch by micro-batch on the training device (the
    trainer's): it asks only for what the learner's counts need."""

    token_count: "Tensor"
    """T_tok of the whole minibatch, summed over ranks."""
    micro_batches: int

    def mask(self, position: int) -> "Tensor": ...

    def constants(self, position: int) -> dict[str, "Tensor"]:
        """The learner's constant log-probs (its `Learner.needs`), by name."""
        ...

    def policy_logp(self, position: int) -> "Tensor":
        """log π_θ without gradient."""
        ...

    def total(self, count: "Tensor") -> "Tensor":
        """``count`` summed over the ranks."""
        ...
