"""What every learner shares: the named result and its statistic kinds, and the tensor helpers of SPEC.md."""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Max:
    """A scalar bound (e.g. the largest token weight): the maximum over micro-batches and ranks."""

    value: Tensor


@dataclass(frozen=True)
class GroupMean:
    """One value per group [G] (e.g. J_g): logged as the mean over all groups of the minibatch."""

    value: Tensor


@dataclass(frozen=True)
class GroupWeights:
    """Softmax weights q [B] within each group: not logged; the trainer derives the weights' effective sample
    sizes (ggpo/q_ess, ggpo/success_ess) from all groups of the minibatch."""

    value: Tensor


@dataclass(frozen=True)
class Derived:
    """A statistic computed from other statistics of the same result, after they are reduced (e.g. a variance
    from the token means of C² and C)."""

    inputs: tuple[str, ...]
    derive: Callable[..., float]


Stat = Tensor | Max | GroupMean | GroupWeights | Derived
"""A statistic of a learner; its type says how it is reduced (see `LossOutput`)."""


@dataclass(frozen=True)
class LossOutput:
    """A learner's scalar loss and its detached statistics (keys listed in each learner's docstring).

    Each statistic says by its type how a trainer reduces it over micro-batches and ranks:
    - a scalar Tensor is normalized by the global counts (T_tok), so it sums;
    - a [B] Tensor (per-response values such as an advantage) is kept for tests and inspection, not logged;
    - `Max`, `GroupMean`, `GroupWeights` and `Derived` reduce as their docstrings say.
    """

    loss: Tensor
    stats: dict[str, Stat]


def _check_groups(rewards: Tensor, group_size: int) -> None:
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got {group_size}")
    if rewards.shape[0] % group_size:
        raise ValueError(
            f"{rewards.shape[0]} responses do not split into groups of {group_size}: a (micro-)batch must "
            "hold whole groups, each group's responses adjacent"
        )


def _token_count(mask: Tensor, token_count: float | Tensor | None, like: Tensor) -> Tensor:
    """T_tok in `like`'s dtype (an integer count would demote float64 math): the given global count, or this
    call's own valid-token count."""
    count = mask.sum() if token_count is None else token_count
    return torch.as_tensor(count, dtype=like.dtype, device=like.device)


def _seq_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Σ_t M_t x_t per response: [B, T] -> [B] (s_i when x is logp)."""
    return (mask * x).sum(dim=-1)


def _token_sum_over(x: Tensor, mask: Tensor, T_tok: Tensor) -> Tensor:
    """(1/T_tok) Σ_{i,t} M_t x_t: a token mean under the global normalization."""
    return (mask * x).sum() / T_tok


def _groups(x: Tensor, group_size: int) -> Tensor:
    """[B] -> [G, m]."""
    return x.reshape(-1, group_size)


LOG_RATIO_BOUND = 20.0
"""|log-ratio| before any ratio is exponentiated. Far outside every clip range (PPO 1 ± ε, dual clip c, TIS
cap, k3 clamp), so no gradient that a clip lets through changes; it keeps exp finite, because a token the
behavior policy rated near-impossible (log μ = −100) would otherwise give exp(100) = inf in fp32 and a NaN
gradient (inf × the 0 gradient of a clipped branch)."""


def _ratio(log_ratio: Tensor) -> Tensor:
    """exp(log-ratio), the log-ratio first clamped to ±LOG_RATIO_BOUND: [B, T]."""
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
