"""The learners as pure functions of tensors: SPEC.md's five, SPEC-beyond's, and the RFT control.

SPEC.md: GGPO, GGPO-clip, AGRO, GRPO, GRPO+TIS. SPEC-beyond.md: Proximal KL (PG is its β = 0 case), CISPO,
sequence-level IS, IS-free, GGPO reward-only weights.

Shape legend (every function): B = G·m responses in group-contiguous order (the m responses of group g are
rows g·m … g·m + m − 1), G groups, m = group_size, T tokens.

    logp           [B, T]  learner token log-probs log π_θ(a_t | …), with grad
    ref_logp       [B, T]  reference log-probs (constant)
    old_logp       [B, T]  old-learner log-probs, GRPO+TIS only (constant)
    behavior_logp  [B, T]  stored engine log-probs log μ (constant)
    mask           [B, T]  M_t: 1 for valid generated tokens (float or bool); padding entries must be finite
    rewards        [B]     r_i

Normalization is explicit and global: every loss divides by `token_count` = T_tok, the valid-token count
of the whole minibatch (all micro-batches, all devices); None means `mask.sum()` (the call is the whole
minibatch). Each loss is then a sum of per-group terms over one shared constant, so a trainer that cuts the
minibatch into micro-batches on group boundaries, passes the global T_tok to each call and sums the
gradients gets exactly the full-minibatch gradient (and the summed losses equal the full loss). Scalar stats
are normalized the same way (they sum over micro-batches) except those STAT_REDUCTIONS names; per-response and
per-group stats concatenate.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class LossOutput:
    """A learner's scalar loss and its detached statistics (keys listed in each learner's docstring)."""

    loss: Tensor
    stats: dict[str, Tensor]


# ----------------------------------------------------------------------------------------------------
# Shared pieces


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


def _grpo_advantage(rewards: Tensor, m: int) -> Tensor:
    """A_i = (r_i − mean r) / (std r + 1e-6), sample std (ddof = 1) per group: [B] -> [B]."""
    r = _groups(rewards, m)  # [G, m]
    return ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-6)).flatten()


class _PolicyGradient(NamedTuple):
    pg: Tensor  # [B, T] per-token loss pg_t
    clipped: Tensor  # [B, T] bool, the PPO clip branch is the active one
    dual_clipped: Tensor  # [B, T] bool, the dual clip bound is the active one


def _ppo_dual_clip(ratio: Tensor, A: Tensor, clip_eps: float, dual_clip: float) -> _PolicyGradient:
    """pg_t = max(−A ρ_t, −A clip(ρ_t, 1−ε, 1+ε)), then min(pg_t, −A·c) where A < 0 (dual clip)."""
    A = A[:, None]  # [B, 1]
    pg1 = -A * ratio
    pg2 = -A * ratio.clamp(1 - clip_eps, 1 + clip_eps)
    pg = torch.maximum(pg1, pg2)
    pg3 = -A * dual_clip
    dual_clipped = (A < 0) & (pg3 < pg)
    return _PolicyGradient(torch.where(dual_clipped, pg3, pg), pg2 > pg1, dual_clipped)


def _grpo_stats(A: Tensor, pg: _PolicyGradient, kl: Tensor, mask: Tensor, T_tok: Tensor) -> dict[str, Tensor]:
    """advantage [B]; clip_frac, dual_clip_frac and kl as token means under the global normalization."""
    return {
        "advantage": A,
        "clip_frac": _token_sum_over(pg.clipped, mask, T_tok),
        "dual_clip_frac": _token_sum_over(pg.dual_clipped, mask, T_tok),
        "kl": _token_sum_over(kl.detach(), mask, T_tok),
    }


LOG_RATIO_BOUND = 20.0
"""|log-ratio| before any ratio is exponentiated. Far outside every clip range (PPO 1 ± ε, dual clip c, TIS
cap, k3 clamp), so no gradient that a clip lets through changes; it keeps exp finite, because a token the
behavior policy rated near-impossible (log μ = −100) would otherwise give exp(100) = inf in fp32 and a NaN
gradient (inf × the 0 gradient of a clipped branch)."""


def _ratio(log_ratio: Tensor) -> Tensor:
    """exp(log-ratio), the log-ratio first clamped to ±LOG_RATIO_BOUND: [B, T]."""
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()


def _k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """kl_t = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1, clamped to [−10, 10]: [B, T]."""
    log_ratio = (ref_logp - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return (log_ratio.exp() - log_ratio - 1).clamp(-10.0, 10.0)


# ----------------------------------------------------------------------------------------------------
# Learners


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
    return LossOutput(loss, {"q": q.flatten(), "group_loss": J.detach(), "adjusted_reward": R.flatten()})


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
    return LossOutput(loss, {"q": q_bar.flatten(), "group_loss": _log_mean_exp_gap(R_bar, beta)})


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
    pg = _ppo_dual_clip(ratio, A, clip_eps, dual_clip)
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
    pg = _ppo_dual_clip(ratio, A, clip_eps, dual_clip)
    kl = _k3_kl(logp, ref_logp)  # [B, T]
    loss = _token_sum_over(w * pg.pg, mask, T_tok) + kl_coef * _token_sum_over(kl, mask, T_tok)
    stats = {
        **_grpo_stats(A, pg, kl, mask, T_tok),
        "tis_weight_mean": _token_sum_over(w, mask, T_tok),
        "tis_clip_frac": _token_sum_over(raw_w > tis_cap, mask, T_tok),
    }
    return LossOutput(loss, stats)


# ----------------------------------------------------------------------------------------------------
# The second paper's learners (SPEC-beyond.md): one ascent surrogate J = (1/T_tok) Σ M_t sg[κ_t] log π_θ(a_t),
# differing only in the per-token coefficient κ_t.


class NonFiniteCoefficient(ValueError):
    """A learner's coefficient κ is inf or NaN (an importance weight overflowed): SPEC-beyond never clamps."""


def _group_mean_advantage(rewards: Tensor, m: int) -> Tensor:
    """Â_i = r_i − (1/m) Σ_j r_j per group, no std (SPEC-beyond §1b, P6): [B] -> [B]."""
    r = _groups(rewards, m)
    return (r - r.mean(dim=1, keepdim=True)).flatten()


def _future_kl_credit(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float, horizon: int | None, cost_bound: float
) -> tuple[Tensor, Tensor]:
    """(C, ℓ): C_t = β Σ_{u=t}^{t+H−1} M_u clip(ℓ_u, −ε_F, ε_F) with ℓ = log π_θ − log π_ref (detached, k1),
    through the end of the response; H = None is the full tail (SPEC-beyond §1, P1–P3): [B, T] each."""
    cost = logp.detach() - ref_logp  # ℓ_t
    bounded = mask * cost.clamp(-cost_bound, cost_bound)
    tail = bounded.flip(-1).cumsum(-1).flip(-1)  # S_t = Σ_{u≥t} M_u ℓ̄_u
    if horizon is not None and horizon < tail.shape[1]:
        later = torch.zeros_like(tail)
        later[:, : tail.shape[1] - horizon] = tail[:, horizon:]  # S_{t+H}, 0 past the end
        tail = tail - later
    return beta * tail, cost


def _score_surrogate(logp: Tensor, kappa: Tensor, mask: Tensor, T_tok: Tensor) -> Tensor:
    """L = −(1/T_tok) Σ M_t sg[κ_t] log π_θ(a_t), after refusing a non-finite κ."""
    kappa = kappa.detach()
    if not torch.isfinite(mask * kappa).all():
        raise NonFiniteCoefficient("a learner coefficient κ is not finite (an importance weight overflowed)")
    return -_token_sum_over(kappa * logp, mask, T_tok)


def _credit_stats(A: Tensor, C: Tensor, cost: Tensor, mask: Tensor, cost_bound: float, T_tok: Tensor) -> dict:
    """pkl/* statistics (token means over T_tok; the variance from the token means of C and C²)."""
    credit_mean = _token_sum_over(C, mask, T_tok)
    return {
        "pkl/cost_mean": _token_sum_over(cost, mask, T_tok),
        "pkl/cost_clip_frac": _token_sum_over(cost.abs() > cost_bound, mask, T_tok),
        "pkl/credit_mean": credit_mean,
        "pkl/credit_square_mean": _token_sum_over(C.square(), mask, T_tok),
        "pkl/sign_flip_frac": _token_sum_over((A[:, None] > 0) & (A[:, None] - C < 0), mask, T_tok),
    }


def _weight_stats(w: Tensor, mask: Tensor, T_tok: Tensor) -> dict:
    return {"is/w_mean": _token_sum_over(w, mask, T_tok), "is/w_max": (mask * w).amax().detach()}


STAT_REDUCTIONS: dict[str, str] = {"is/w_max": "max"}
"""Scalar stats that do not sum over micro-batches and ranks: the trainer reduces these as named."""
DERIVED_STATS = {
    "pkl/credit_var": (("pkl/credit_square_mean", "pkl/credit_mean"), lambda square, mean: square - mean**2),
}
"""Stats computed from reduced ones, as (inputs, function): a variance from the token means of C² and C."""


def proximal_kl_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    ref_logp: Tensor | None = None,
    *,
    group_size: int,
    beta: float,
    horizon: int | None = None,
    cost_bound: float = 0.05,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """Proximal KL (SPEC-beyond §1; PKL paper Sec. 4, Eq. 5–7): token IS with future KL credit.

        w_t = exp(log π_θ − log μ)                     (detached, no cap)
        Â_i = r_i − mean_j r_j                         (group mean, no std)
        C_t = β Σ_{u=t}^{t+H−1} M_u clip(ℓ_u, ±ε_F)    ℓ = log π_θ − log π_ref (k1, detached)
        κ_t = w_t (Â_i − C_t);  L = −(1/T_tok) Σ M_t sg[κ_t] log π_θ(a_t)

    ``horizon`` H: None = the full tail; 0 or β = 0 gives PG (κ = w Â, then ``ref_logp`` may be None).
    No PPO clip, no IS truncation, no KL to π0, no entropy term.

    stats: advantage [B]; pkl/* (cost, credit, sign flips) and is/w_mean, is/w_max.
    """
    _check_groups(rewards, group_size)
    T_tok = _token_count(mask, token_count, logp)
    A = _group_mean_advantage(rewards, group_size)  # [B]
    w = (logp.detach() - behavior_logp).exp()  # [B, T]
    stats = {"advantage": A, **_weight_stats(w, mask, T_tok)}
    if beta == 0 or horizon == 0 or ref_logp is None:
        if ref_logp is None and beta != 0 and horizon != 0:
            raise ValueError("proximal_kl_loss needs ref_logp unless beta = 0 or horizon = 0 (PG)")
        return LossOutput(_score_surrogate(logp, w * A[:, None], mask, T_tok), stats)
    C, cost = _future_kl_credit(logp, ref_logp, mask, beta, horizon, cost_bound)
    loss = _score_surrogate(logp, w * (A[:, None] - C), mask, T_tok)
    return LossOutput(loss, {**stats, **_credit_stats(A, C, cost, mask, cost_bound, T_tok)})


def cispo_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    cispo_low: float = 0.0,
    cispo_high: float = 1.28,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """CISPO (SPEC-beyond §2; MiniMax-M1 Eq. 4–5): the detached token weight clipped, no KL credit.

        κ_t = clip(exp(log π_θ − log μ), c_lo, c_hi) · Â_i;   L = −(1/T_tok) Σ M_t sg[κ_t] log π_θ(a_t)

    Both bounds clip the weight only; every token keeps its score-function gradient (unlike PPO's clip).

    stats: advantage [B]; is/w_mean, is/w_max (unclipped w); cispo/clip_frac_low, cispo/clip_frac_high.
    """
    _check_groups(rewards, group_size)
    if not 0 <= cispo_low <= cispo_high:
        raise ValueError(f"CISPO needs 0 <= c_lo <= c_hi, got {cispo_low}, {cispo_high}")
    T_tok = _token_count(mask, token_count, logp)
    A = _group_mean_advantage(rewards, group_size)
    w = (logp.detach() - behavior_logp).exp()
    loss = _score_surrogate(logp, w.clamp(cispo_low, cispo_high) * A[:, None], mask, T_tok)
    stats = {
        "advantage": A,
        **_weight_stats(w, mask, T_tok),
        "cispo/clip_frac_low": _token_sum_over(w < cispo_low, mask, T_tok),
        "cispo/clip_frac_high": _token_sum_over(w > cispo_high, mask, T_tok),
    }
    return LossOutput(loss, stats)


def seq_is_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    beta: float,
    horizon: int | None = None,
    cost_bound: float = 0.05,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """Sequence-level IS control (SPEC-beyond §3; PKL paper Eq. 11, GSPO-token): Proximal KL with the token
    weight replaced by its geometric mean over the response.

        w̄_i = exp((1/T_i) Σ_t M_t (log π_θ − log μ))   (detached);   κ_t = w̄_i (Â_i − C_t)

    stats: as `proximal_kl_loss` (is/* of w̄).
    """
    _check_groups(rewards, group_size)
    T_tok = _token_count(mask, token_count, logp)
    A = _group_mean_advantage(rewards, group_size)
    w_bar = (_seq_sum(logp.detach() - behavior_logp, mask) / mask.sum(dim=-1)).exp()  # [B]
    C, cost = _future_kl_credit(logp, ref_logp, mask, beta, horizon, cost_bound)
    loss = _score_surrogate(logp, w_bar[:, None] * (A[:, None] - C), mask, T_tok)
    w_tokens = w_bar[:, None].expand_as(mask)
    stats = {
        "advantage": A,
        **_weight_stats(w_tokens, mask, T_tok),
        **_credit_stats(A, C, cost, mask, cost_bound, T_tok),
    }
    return LossOutput(loss, stats)


def is_free_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    beta: float,
    horizon: int | None = None,
    cost_bound: float = 0.05,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """IS-free control (SPEC-beyond §4; PKL paper Eq. 12): Proximal KL with the weight set to one.

        κ_t = Â_i − C_t;   L = −(1/T_tok) Σ M_t sg[κ_t] log π_θ(a_t)      (takes no behavior log-probs)

    Not AGRO: no full-sequence residual, no leave-one-out baseline, a window H.

    stats: advantage [B]; pkl/*.
    """
    _check_groups(rewards, group_size)
    T_tok = _token_count(mask, token_count, logp)
    A = _group_mean_advantage(rewards, group_size)
    C, cost = _future_kl_credit(logp, ref_logp, mask, beta, horizon, cost_bound)
    loss = _score_surrogate(logp, A[:, None] - C, mask, T_tok)
    return LossOutput(loss, {"advantage": A, **_credit_stats(A, C, cost, mask, cost_bound, T_tok)})


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
    return LossOutput(loss, {"q": q.flatten()})


def rft_loss(
    logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    token_count: float | Tensor | None = None,
) -> LossOutput:
    """Rejection-sampling fine-tuning control: the NLL of the minibatch's correct responses (r = 1).

        L = −(1/T_tok) Σ_{i: r_i = 1} Σ_t M_t log π_θ(a_t)

    Normalized by the minibatch's T_tok like every learner (exact under micro-batching): the token mean
    over correct responses times their share of the minibatch's tokens. No reference, no IS.

    stats: correct_token_frac (the share of T_tok in correct responses).
    """
    _check_groups(rewards, group_size)
    T_tok = _token_count(mask, token_count, logp)
    correct = (rewards > 0.5).to(logp.dtype)[:, None]  # [B, 1]
    loss = -_token_sum_over(correct * logp, mask, T_tok)
    return LossOutput(loss, {"correct_token_frac": _token_sum_over(correct.expand_as(mask), mask, T_tok)})
