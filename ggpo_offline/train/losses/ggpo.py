"""GGPO and its kin: GGPO, GGPO-clip, AGRO (SPEC.md), GGPO with reward-only weights (SPEC-beyond §5) and
GGPO with a bounded push (an ablation, docs/learners.md)."""

import math

import torch
from torch import Tensor

from ggpo_offline.train.losses.common import (
    GroupMean,
    GroupWeights,
    LossOutput,
    _check_groups,
    _groups,
    _seq_sum,
    _token_count,
)


def _adjusted_reward(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: Tensor, beta: float, m: int
) -> Tensor:
    """R_i = r_i − β (s_i − s_i^ref), grouped: [G, m]. Gradient flows through s_i."""
    s, s_ref = _seq_sum(logp, mask), _seq_sum(ref_logp, mask)  # [B], [B]
    return _groups(rewards - beta * (s - s_ref), m)


def _log_mean_exp_gap(R: Tensor, beta: float) -> Tensor:
    """J_g = β log((1/m) Σ_i exp(R_i/β)) − (1/m) Σ_i R_i, via logsumexp: [G, m] -> [G] (≥ 0)."""
    m = R.shape[1]
    return beta * (torch.logsumexp(R / beta, dim=1) - math.log(m)) - R.mean(dim=1)


def _ggpo_coefficient(q: Tensor) -> Tensor:
    """c_i = (m q_i − 1) / sqrt(m − 1) (paper Eq. 9): [G, m] -> [G, m]."""
    m = q.shape[1]
    return (m * q - 1) / math.sqrt(m - 1)


def ggpo_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    beta: float,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """GGPO (paper Eq. 6, 11; Algorithm 1): group log-mean-exp loss of KL-adjusted rewards, differentiated.

        R_i    = r_i − β (s_i − s_i^ref)
        J_g    = β log((1/m) Σ_i exp(R_i/β)) − (1/m) Σ_i R_i
        L_GGPO = Σ_g J_g / (G β ℓ̄ sqrt(m−1)) = Σ_g J_g · m / (β T_tok sqrt(m−1))

    The second form uses G·ℓ̄ = T_tok/m (ℓ̄ = T_tok/(G·m) over the whole minibatch), so only the global token
    count is needed. Its gradient is −(1/T_tok) Σ_i c_i ∇s_i with q = softmax_i(R_i/β) and
    c_i = (m q_i − 1)/sqrt(m−1) (Eq. 9). No behavior log-probs, no importance weight, no PPO ratio or clip,
    no additive KL term.

    stats: q [B] (detached softmax weights), group_loss J_g [G], adjusted_reward R_i [B].
    """
    _check_groups(rewards, group_size)
    m, T_tok = group_size, _token_count(mask, token_count, logp)
    R = _adjusted_reward(logp, ref_logp, mask, rewards, beta, m)  # [G, m]
    J = _log_mean_exp_gap(R, beta)  # [G]
    loss = J.sum() * m / (beta * T_tok * math.sqrt(m - 1))
    R = R.detach()
    q = torch.softmax(R / beta, dim=1)  # [G, m]
    stats = {
        "q": GroupWeights(q.flatten()),
        "group_loss": GroupMean(J.detach()),
        "adjusted_reward": R.flatten(),
    }
    return LossOutput(loss, stats)


def ggpo_clip_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    beta: float,
    clip: float = 0.05,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """GGPO with token clipping (paper Eq. 12, 63–65): detached coefficients from clipped token log ratios.

        d_t    = log π_θ(a_t) − log π_ref(a_t)
        R̄_i    = r_i − β Σ_t M_t clip(d_t, −c_clip, c_clip)
        q̄      = softmax_i(R̄_i/β);   c̄_i = (m q̄_i − 1)/sqrt(m−1)
        L_clip = −(1/T_tok) Σ_i sg[c̄_i] · s_i

    The clip enters only the coefficients; s_i is unclipped, so saturated tokens keep their score gradients.
    With clip = inf its gradient equals `ggpo_loss`'s. The loss value is the surrogate, not J_g.
    No behavior log-probs, no importance weight, no PPO ratio, no additive KL term.

    stats: q (q̄) [B], group_loss [G] = the clipped statistic β log mean_i exp(R̄_i/β) − mean_i R̄_i.
    """
    _check_groups(rewards, group_size)
    m, T_tok = group_size, _token_count(mask, token_count, logp)
    d = logp.detach() - ref_logp  # [B, T]
    R_bar = _groups(rewards - beta * _seq_sum(d.clamp(-clip, clip), mask), m)  # [G, m]
    q_bar = torch.softmax(R_bar / beta, dim=1)  # [G, m]
    c_bar = _ggpo_coefficient(q_bar).flatten()  # [B]
    loss = -(c_bar * _seq_sum(logp, mask)).sum() / T_tok
    stats = {"q": GroupWeights(q_bar.flatten()), "group_loss": GroupMean(_log_mean_exp_gap(R_bar, beta))}
    return LossOutput(loss, stats)


def agro_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    beta: float,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """AGRO (paper Appendix C.2, Eq. 62): leave-one-out advantage of KL-adjusted rewards times s_i.

        z_i    = r_i − β (s_i − s_i^ref)
        a_i    = m/(m−1) · (z_i − mean_j z_j)
        L_AGRO = −(1/T_tok) Σ_i sg[a_i] · s_i

    No PPO ratio, no clipping, no importance weight, no additive KL, no entropy term.

    stats: advantage a_i [B].
    """
    _check_groups(rewards, group_size)
    m, T_tok = group_size, _token_count(mask, token_count, logp)
    z = _adjusted_reward(logp, ref_logp, mask, rewards, beta, m).detach()  # [G, m]
    a = (m / (m - 1) * (z - z.mean(dim=1, keepdim=True))).flatten()  # [B]
    loss = -(a * _seq_sum(logp, mask)).sum() / T_tok
    return LossOutput(loss, {"advantage": a})


def ggpo_reward_only_loss(
    logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    beta: float,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """GGPO with reward-only weights (SPEC-beyond §5; GGPO paper App. D.6): q from rewards alone.

        q̃_i = softmax_i(r_i/β);   c̃_i = (m q̃_i − 1)/sqrt(m−1);   L = −(1/T_tok) Σ_i c̃_i s_i

    No reference, no KL, no refresh, no IS; c̃ does not depend on θ, so this is GGPO's update with q̃.

    stats: q (q̃) [B].
    """
    _check_groups(rewards, group_size)
    T_tok = _token_count(mask, token_count, logp)
    q = torch.softmax(_groups(rewards, group_size) / beta, dim=1)  # [G, m]
    c = _ggpo_coefficient(q).flatten()
    loss = -(c * _seq_sum(logp, mask)).sum() / T_tok
    return LossOutput(loss, {"q": GroupWeights(q.flatten())})


def ggpo_bounded_push_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    beta: float,
    push_bound: float,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """GGPO with a bounded push (an ablation, docs/learners.md): GGPO's coefficients, where a negative one is
    kept only while its response's sequence log-ratio to π_ref is above −B (``push_bound``, nats).

        R_i  = r_i − β (s_i − s_i^ref);   q = softmax_i(R_i/β);   c_i = (m q_i − 1)/sqrt(m−1)   (Eq. 9)
        c̃_i  = c_i · 1[c_i ≥ 0  or  s_i − s_i^ref > −B]
        L    = −(1/T_tok) Σ_i sg[c̃_i] · s_i

    GGPO keeps pushing a wrong response down until its log-ratio lies ~1/β nats below a right one's (q_i
    stays ≈ 0, so c_i ≈ −1/sqrt(m−1)); here the push stops B nats below π_ref. With B = inf the gradient
    equals `ggpo_loss`'s. The loss value is the surrogate. No behavior log-probs, no importance weight.

    stats: q [B], group_loss J_g [G] (as GGPO's), push_cut [G] (each group's share of responses whose
    negative coefficient was dropped).
    """
    _check_groups(rewards, group_size)
    m, T_tok = group_size, _token_count(mask, token_count, logp)
    s = _seq_sum(logp, mask)  # [B]
    log_ratio = s.detach() - _seq_sum(ref_logp, mask)  # [B]
    R = _groups(rewards - beta * log_ratio, m)  # [G, m]
    q = torch.softmax(R / beta, dim=1)  # [G, m]
    c = _ggpo_coefficient(q).flatten()  # [B]
    cut = (c < 0) & (log_ratio <= -push_bound)  # [B]
    loss = -(torch.where(cut, 0.0, c) * s).sum() / T_tok
    stats = {
        "q": GroupWeights(q.flatten()),
        "group_loss": GroupMean(_log_mean_exp_gap(R, beta)),
        "push_cut": GroupMean(_groups(cut.to(logp.dtype), m).mean(dim=1)),
    }
    return LossOutput(loss, stats)
