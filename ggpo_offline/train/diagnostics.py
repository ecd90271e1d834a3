"""SPEC.md "Diagnostics" (paper Appendix C.1) as pure, detached functions of tensors.

Shapes as in `losses`: B = G·m responses in group-contiguous order, T tokens; logp, behavior_logp, ref_logp,
mask [B, T]; q, rewards [B]. λ_t = log π_θ(a_t) − log μ(a_t) on masked tokens.

Accumulating over micro-batches gives exactly the full-batch value:
- token means (`mismatch_k3`, `mismatch_drift`, `token_entropy_mean`) divide by `token_count`, and
  `ref_log_ratio` by `response_count`; pass the whole block's count to every call and SUM the results
  (None means this call's own count: the call is the whole block);
- `sequence_ess`, `q_ess_median` and `success_ess` need the whole block at once: CONCATENATE the per-response
  inputs (`sequence_log_weights(...)`, q, rewards) over micro-batches and call once.
"""

import math

import torch
from torch import Tensor

from ggpo_offline.train.losses import LOG_RATIO_BOUND


def _count(mask: Tensor, count: float | Tensor | None) -> float | Tensor:
    return mask.sum() if count is None else count


@torch.no_grad()
def mismatch_k3(
    logp: Tensor, behavior_logp: Tensor, mask: Tensor, *, token_count: float | Tensor | None = None
) -> Tensor:
    """`mismatch/k3`: token mean of exp(λ_t) − λ_t − 1 (≥ 0, 0 iff learner = behavior on every token); λ_t is
    clamped to ±20 as in the losses, so one token μ rated near-impossible cannot make the metric inf."""
    lam = (logp - behavior_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B, T]
    # expm1(λ) − λ, not exp(λ) − 1 − λ: near λ = 0 (a learner that still equals the behavior policy) the
    # latter rounds to small negative values in float32.
    return (mask * (torch.expm1(lam) - lam)).sum() / _count(mask, token_count)


@torch.no_grad()
def mismatch_drift(
    logp: Tensor, behavior_logp: Tensor, mask: Tensor, *, token_count: float | Tensor | None = None
) -> Tensor:
    """`mismatch/drift`: token mean of |λ_t|."""
    return (mask * (logp - behavior_logp).abs()).sum() / _count(mask, token_count)


@torch.no_grad()
def sequence_log_weights(logp: Tensor, behavior_logp: Tensor, mask: Tensor) -> Tensor:
    """log w_i = Σ_t M_t λ_t, the sequence log importance weights for `sequence_ess`: [B, T] -> [B]."""
    return (mask * (logp - behavior_logp)).sum(dim=-1)


@torch.no_grad()
def sequence_ess(seq_log_weights: Tensor) -> Tensor:
    """`mismatch/ess`: (Σ_i w_i)² / (B Σ_i w_i²) ∈ [1/B, 1] from log w_i [B], in log space (logsumexp)."""
    B = seq_log_weights.shape[0]
    log_ess = 2 * torch.logsumexp(seq_log_weights, 0) - torch.logsumexp(2 * seq_log_weights, 0) - math.log(B)
    return log_ess.exp()


@torch.no_grad()
def ref_log_ratio(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, *, response_count: float | Tensor | None = None
) -> Tensor:
    """`ref/log_ratio`: mean over responses of s_i − s_i^ref, divided by `response_count` (default B)."""
    count = logp.shape[0] if response_count is None else response_count
    return (mask * (logp - ref_logp)).sum() / count


@torch.no_grad()
def token_entropy(logits: Tensor) -> Tensor:
    """Full-vocabulary next-token entropy −Σ_v p_v log p_v, p = softmax(logits): [B, T, V] -> [B, T].

    Computed in at least float32; −inf logits (masked vocabulary entries) contribute 0."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.special.entr(torch.softmax(logits, dim=-1)).sum(dim=-1)


@torch.no_grad()
def token_entropy_mean(entropy: Tensor, mask: Tensor, *, token_count: float | Tensor | None = None) -> Tensor:
    """`policy/entropy`: token mean of the learner's entropy [B, T] (from `token_entropy`)."""
    return (mask * entropy).sum() / _count(mask, token_count)


@torch.no_grad()
def q_ess_median(q: Tensor, group_size: int) -> Tensor:
    """`ggpo/q_ess`: per group 1/Σ_i q_i² ∈ [1, m] from GGPO's softmax weights q [B]; the median over groups
    (the mean of the two middle values when G is even)."""
    ess = 1 / q.reshape(-1, group_size).square().sum(dim=1)  # [G]
    return torch.quantile(ess, 0.5)


@torch.no_grad()
def success_ess(q: Tensor, rewards: Tensor, group_size: int) -> Tensor | None:
    """`ggpo/success_ess`: over groups with k ≥ 2 correct responses S (reward 1), [k Σ_{i∈S} q̃_i²]^{-1}
    ∈ [1/k, 1] with q̃ = q / Σ_S q. Returns its mean over those groups, or None (not NaN) when no group has
    two correct responses."""
    q, correct = q.reshape(-1, group_size), rewards.reshape(-1, group_size) > 0.5  # [G, m], [G, m]
    k = correct.sum(dim=1)  # [G]
    q_s = torch.where(correct, q, 0.0)[k >= 2]  # [G', m]
    if q_s.shape[0] == 0:
        return None
    q_tilde = q_s / q_s.sum(dim=1, keepdim=True)
    return (1 / (k[k >= 2] * q_tilde.square().sum(dim=1))).mean()
