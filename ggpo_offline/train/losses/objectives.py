"""The per-token objectives ℓ_t of SPEC-corrections.md that the frameworks put a correction on.

Each takes the advantage A [B], the learner's log-probs and the log-ratio ρ = log π_θ − log π_old it acts on
(with gradient; π_old is μ in bypass mode) and returns ℓ [B, T] before any behaviour weight or aggregation.
"""

from typing import NamedTuple

import torch
from torch import Tensor

from ggpo_offline.train.losses.common import _ratio, _seq_sum


class PolicyGradient(NamedTuple):
    pg: Tensor  # [B, T] per-token loss pg_t
    clipped: Tensor  # [B, T] bool, the PPO clip branch is the active one
    dual_clipped: Tensor  # [B, T] bool, the dual clip bound is the active one


def ppo_dual_clip(
    ratio: Tensor, A: Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> PolicyGradient:
    """SPEC.md GRPO's pg_t (SPEC-corrections' PPO_dual): pg_t = max(−A ρ_t, −A clip(ρ_t, 1−ε_l, 1+ε_h)), then
    with a dual clip c, pg_t = min(pg_t, −A·c) where A < 0 (the bound taken only where it is lower, so a tie
    keeps pg_t's gradient whole)."""
    A = A[:, None]  # [B, 1]
    pg1 = -A * ratio
    pg2 = -A * ratio.clamp(1 - eps_low, 1 + eps_high)
    pg = torch.maximum(pg1, pg2)
    if dual_clip is None:
        return PolicyGradient(pg, pg2 > pg1, torch.zeros_like(pg, dtype=torch.bool))
    pg3 = -A * dual_clip
    dual_clipped = (A < 0) & (pg3 < pg)
    return PolicyGradient(torch.where(dual_clipped, pg3, pg), pg2 > pg1, dual_clipped)


def ppo(log_ratio: Tensor, A: Tensor, eps_low: float, eps_high: float, dual_clip: float | None) -> Tensor:
    """PPO(x) = max(−A·x, −A·clip(x, 1−ε_l, 1+ε_h)) on x = exp(log_ratio), dual-clipped (`ppo_dual_clip`)."""
    return ppo_dual_clip(_ratio(log_ratio), A, eps_low, eps_high, dual_clip).pg


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO's token-wise sequence ratio in log space: sg[log s_i] + log π_θ − sg[log π_θ], with
    log s_i = Σ_t M ρ_t / L_i capped at 10 (verl ``loss_mode=gspo``): the value of s_i on every token, the
    gradient of one token's log-prob."""
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    log_s = (_seq_sum(log_ratio, mask)[:, None] / lengths).clamp(max=10.0)
    return log_s.detach() + log_ratio - log_ratio.detach()


def score(logp: Tensor, A: Tensor, coefficient: Tensor) -> Tensor:
    """−sg[c]·A·log π_θ: REINFORCE with a constant token coefficient (verl bypass ``reinforce``; CISPO,
    TOPR with c the clipped ratio)."""
    return -coefficient.detach() * A[:, None] * logp


def sapo(log_ratio: Tensor, A: Tensor, tau_pos: float, tau_neg: float) -> Tensor:
    """SAPO: −σ(τ(r − 1))·4/τ·A, τ = τ_pos where A > 0 else τ_neg; the gradient flows through r."""
    A = A[:, None]
    tau = torch.where(A > 0, torch.as_tensor(tau_pos, dtype=A.dtype), torch.as_tensor(tau_neg, dtype=A.dtype))
    return -torch.sigmoid(tau * (_ratio(log_ratio) - 1)) * 4 / tau * A


def probability_gap_keep(
    logp: Tensor, behavior_logp: Tensor, A: Tensor, low: float, high: float, both_sides: bool
) -> Tensor:
    """prime-rl's mask on Δp = π_θ − μ (constant): ``default`` drops Δp > high where A > 0 and Δp < −low
    otherwise; ``ipo`` (``both_sides``) drops Δp outside [−low, high] whatever A's sign."""
    gap = logp.detach().exp() - behavior_logp.exp()
    A = A[:, None]
    dropped = (gap > high) | (gap < -low) if both_sides else torch.where(A > 0, gap > high, gap < -low)
    return (~dropped).to(logp.dtype)


def dppo(log_ratio: Tensor, A: Tensor, keep: Tensor, adv_tau: float, kl_tau: float) -> Tensor:
    """prime-rl ``default_loss_fn``: −keep·adv_tau·A·u + kl_tau·κ², u = π_θ/μ carrying gradient."""
    return -keep * adv_tau * A[:, None] * _ratio(log_ratio) + kl_tau * log_ratio**2


def squared_log_ratio(logp: Tensor, log_ratio: Tensor, A: Tensor, tau: float) -> Tensor:
    """Kimi-1.5 (ROLL ``kimi15``): −A·log π_θ + (τ/2)·ρ²."""
    return -A[:, None] * logp + tau / 2 * log_ratio**2
