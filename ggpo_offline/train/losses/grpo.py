"""GRPO and GRPO+TIS (SPEC.md; paper Appendix C.2): PPO-clipped token ratios with a k3 KL to the reference."""

from torch import Tensor

from ggpo_offline.train.losses.common import (
    LOG_RATIO_BOUND,
    LossOutput,
    _check_groups,
    _groups,
    _ratio,
    _token_count,
    _token_sum_over,
)
from ggpo_offline.train.losses.objectives import PolicyGradient, ppo_dual_clip


def _grpo_advantage(rewards: Tensor, m: int) -> Tensor:
    """A_i = (r_i − mean r) / (std r + 1e-6), sample std (ddof = 1) per group: [B] -> [B]."""
    r = _groups(rewards, m)  # [G, m]
    return ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-6)).flatten()


def _grpo_stats(A: Tensor, pg: PolicyGradient, kl: Tensor, mask: Tensor, T_tok: Tensor) -> dict[str, Tensor]:
    """advantage [B]; clip_frac, dual_clip_frac and kl as token means under the global normalization."""
    return {
        "advantage": A,
        "clip_frac": _token_sum_over(pg.clipped, mask, T_tok),
        "dual_clip_frac": _token_sum_over(pg.dual_clipped, mask, T_tok),
        "kl": _token_sum_over(kl.detach(), mask, T_tok),
    }


def _k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """kl_t = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1, clamped to [−10, 10]: [B, T]."""
    log_ratio = (ref_logp - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return (log_ratio.exp() - log_ratio - 1).clamp(-10.0, 10.0)


def grpo_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    clip_eps: float = 0.2,
    dual_clip: float = 10.0,
    kl_coef: float = 0.01,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """Default GRPO (paper Appendix C.2): PPO-clipped token ratio against the stored behavior log-probs.

        A_i  = (r_i − mean r) / (std r + 1e-6)                      (sample std, per group, constant)
        ρ_t  = exp(log π_θ(a_t) − log μ(a_t))                        (log-ratio clamped to ±20 first)
        pg_t = max(−A ρ_t, −A clip(ρ_t, 1−ε, 1+ε))                  (ε = clip_eps)
        pg_t = min(pg_t, −A c)   if A < 0                            (dual clip, c = dual_clip)
        kl_t = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1, clamped to [−10, 10]
                                                                     (log-ratio clamped to ±20 first)
        L    = (1/T_tok) Σ M_t pg_t + kl_coef · (1/T_tok) Σ M_t kl_t

    No importance weight beyond ρ_t, no entropy bonus.

    stats: advantage A_i [B]; clip_frac, dual_clip_frac (token fractions where each bound is active) and kl
    (token mean of kl_t), each divided by T_tok.
    """
    _check_groups(rewards, group_size)
    T_tok = _token_count(mask, token_count, logp)
    A = _grpo_advantage(rewards, group_size)  # [B]
    ratio = _ratio(logp - behavior_logp)  # [B, T]
    pg = ppo_dual_clip(ratio, A, clip_eps, clip_eps, dual_clip)
    kl = _k3_kl(logp, ref_logp)  # [B, T]
    loss = _token_sum_over(pg.pg, mask, T_tok) + kl_coef * _token_sum_over(kl, mask, T_tok)
    return LossOutput(loss, _grpo_stats(A, pg, kl, mask, T_tok))


def grpo_tis_loss(
    logp: Tensor,
    old_logp: Tensor,
    behavior_logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    tis_cap: float = 2.0,
    clip_eps: float = 0.2,
    dual_clip: float = 10.0,
    kl_coef: float = 0.01,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """GRPO + TIS (paper Appendix C.2, Eq. 61): PPO ratio against π_old, times the capped weight π_old/μ.

        w_t    = min(exp(log π_old(a_t) − log μ(a_t)), cap)          (constant, no normalization)
        ρ_t    = exp(log π_θ(a_t) − log π_old(a_t))                  (both log-ratios clamped to ±20 first)
        loss_t = w_t · pg_t(ρ_t, A)                                  (pg_t, A_i and kl_t as in `grpo_loss`)
        L      = (1/T_tok) Σ M_t loss_t + kl_coef · (1/T_tok) Σ M_t kl_t

    No entropy bonus.

    stats: as `grpo_loss`, plus tis_weight_mean (token mean of w_t) and tis_clip_frac (token fraction with the
    raw weight above the cap), each divided by T_tok.
    """
    _check_groups(rewards, group_size)
    T_tok = _token_count(mask, token_count, logp)
    A = _grpo_advantage(rewards, group_size)  # [B]
    raw_w = _ratio(old_logp - behavior_logp).detach()  # [B, T]
    w = raw_w.clamp(max=tis_cap)
    ratio = _ratio(logp - old_logp)  # [B, T]
    pg = ppo_dual_clip(ratio, A, clip_eps, clip_eps, dual_clip)
    kl = _k3_kl(logp, ref_logp)  # [B, T]
    loss = _token_sum_over(w * pg.pg, mask, T_tok) + kl_coef * _token_sum_over(kl, mask, T_tok)
    stats = {
        **_grpo_stats(A, pg, kl, mask, T_tok),
        "tis_weight_mean": _token_sum_over(w, mask, T_tok),
        "tis_clip_frac": _token_sum_over(raw_w > tis_cap, mask, T_tok),
    }
    return LossOutput(loss, stats)
