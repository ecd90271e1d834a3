"""The second paper's learners (SPEC-beyond §1–4): Proximal KL (PG is its β = 0 case), CISPO, seq-IS, IS-free.

One ascent surrogate J = (1/T_tok) Σ M_t sg[κ_t] log π_θ(a_t); they differ only in the token coefficient κ_t.
"""

import torch
from torch import Tensor

from ggpo_offline.train.losses.common import (
    Derived,
    LossOutput,
    Max,
    _check_groups,
    _groups,
    _seq_sum,
    _token_count,
    _token_sum_over,
)


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


def _variance(square_mean: float, mean: float) -> float:
    """Var = E[C²] − E[C]², from the reduced token means of C² and C."""
    return square_mean - mean**2


def _credit_stats(A: Tensor, C: Tensor, cost: Tensor, mask: Tensor, cost_bound: float, T_tok: Tensor) -> dict:
    """pkl/* statistics (token means over T_tok; the variance derived from the token means of C and C²)."""
    credit_mean = _token_sum_over(C, mask, T_tok)
    return {
        "pkl/cost_mean": _token_sum_over(cost, mask, T_tok),
        "pkl/cost_clip_frac": _token_sum_over(cost.abs() > cost_bound, mask, T_tok),
        "pkl/credit_mean": credit_mean,
        "pkl/credit_square_mean": _token_sum_over(C.square(), mask, T_tok),
        "pkl/sign_flip_frac": _token_sum_over((A[:, None] > 0) & (A[:, None] - C < 0), mask, T_tok),
        "pkl/credit_var": Derived(("pkl/credit_square_mean", "pkl/credit_mean"), _variance),
    }


def _weight_stats(w: Tensor, mask: Tensor, T_tok: Tensor) -> dict:
    return {"is/w_mean": _token_sum_over(w, mask, T_tok), "is/w_max": Max((mask * w).amax().detach())}


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
