"""A framework's rollout correction composed from its parts.

SPEC-corrections.md writes each framework's loss as a per-token objective on a policy ratio, times a constant
behaviour weight and keep-masks, aggregated by a mode. `Correction` (`train.corrections`) names the parts;
`correction_loss` composes them, and `corrected_loss` is the learner (GRPO's group advantage, SPEC.md GRPO).
"""

import torch
from torch import Tensor

from ggpo_offline.train.corrections import OBJECTIVES, Correction
from ggpo_offline.train.losses import behavior, objectives
from ggpo_offline.train.losses.aggregation import aggregate
from ggpo_offline.train.losses.common import (
    LossOutput,
    _check_groups,
    _ratio,
    _token_count,
    _token_sum_over,
)
from ggpo_offline.train.losses.grpo import _grpo_advantage


def _behaviour(correction: Correction, x: Tensor, kappa: Tensor, mask: Tensor, A: Tensor) -> tuple:
    """(weight, keep, truncated): the constant importance weight, the product of every keep-mask, and where
    the truncation changed a weight; each [B, T]."""
    weight = keep = torch.ones_like(x)
    truncated = torch.zeros_like(x, dtype=torch.bool)
    low, high = correction.weight_low, correction.weight_high
    if correction.weight is not None:
        weight = behavior.log_weight(x, mask, correction.weight).exp()
        if correction.filter_level is not None:  # another level's ratio decides, the weight stays as it is
            keep = behavior.inside(behavior.log_weight(x, mask, correction.filter_level).exp(), low, high)
        elif correction.truncate:
            raw, weight = weight, behavior.truncate(weight, low, high)
            truncated = weight != raw
        else:
            keep = behavior.inside(weight, low, high)
    for option, threshold in correction.rejections:
        keep = keep * behavior.rejection_keep(x, mask, option, threshold)
    if correction.second_moment is not None:
        keep = keep * behavior.second_moment_keep(x, mask, correction.second_moment)
    if correction.off_policy_delta is not None:
        keep = keep * behavior.off_policy_sequence_keep(kappa, mask, A, correction.off_policy_delta)
    return weight, keep, truncated


def weight_total(correction: Correction, old_logp: Tensor, behavior_logp: Tensor, mask: Tensor) -> Tensor:
    """This call's part of the total a batch-normalised correction averages (`behavior.weight_total`, its
    truncated weight from λ = log π_old − log μ): the trainer adds the parts of a minibatch's micro-batches
    and ranks, so that each divides by the minibatch's mean, as verl divides by its batch's."""
    c = correction
    mask = mask.to(old_logp.dtype)
    raw = behavior.log_weight(old_logp - behavior_logp, mask, c.weight).exp()
    return behavior.weight_total(behavior.truncate(raw, c.weight_low, c.weight_high), mask, c.weight)


def _objective(
    correction: Correction,
    logp: Tensor,
    rho: Tensor,
    A: Tensor,
    rewards: Tensor,
    mask: Tensor,
    behavior_logp: Tensor,
    weight: Tensor,
) -> Tensor:
    """The per-token objective ℓ [B, T] on the log-ratio ρ (π_θ against π_old, or μ in bypass mode)."""
    c = correction
    ratio = _ratio(rho.detach())
    if c.objective == "ppo":
        return objectives.ppo(rho, A, c.eps_low, c.eps_high, c.dual_clip)
    if c.objective == "gspo":
        return objectives.ppo(objectives.sequence_log_ratio(rho, mask), A, c.eps_low, c.eps_high, None)
    if c.objective == "reinforce":
        return objectives.score(logp, A, weight)
    if c.objective == "cispo":
        return objectives.score(logp, A, ratio.clamp(min=c.coefficient_low, max=c.coefficient_high))
    if c.objective == "topr":
        positive = (rewards > 0)[:, None]
        return objectives.score(logp, A, torch.where(positive, torch.ones_like(ratio), ratio.clamp(0, 1)))
    if c.objective == "sapo":
        return objectives.sapo(rho, A, c.tau_pos, c.tau_neg)
    if c.objective == "dppo":
        keep = objectives.probability_gap_keep(
            logp, behavior_logp, A, c.gap_low, c.gap_high, c.gap_both_sides
        )
        return objectives.dppo(rho, A, keep, c.adv_tau, c.kl_tau)
    if c.objective == "kimi":
        return objectives.squared_log_ratio(logp, rho, A, c.kl_tau)
    raise ValueError(f"unknown objective {c.objective!r}; choose from {', '.join(OBJECTIVES)}")


def correction_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    behavior_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    rewards: Tensor,
    correction: Correction,
    *,
    token_count: float | Tensor | None = None,
    sequence_count: float | Tensor | None = None,
    weight_total: Tensor | None = None,
) -> LossOutput:
    """SPEC-corrections.md's loss of ``correction`` for given advantages A [B]:

        λ = log π_old − log μ,  ρ = log π_θ − log π_old,  κ = λ + ρ        (bypass: π_old := μ, λ = 0)
        w, keep = behaviour(λ or sg κ)                                     (constants)
        w ← w / mean(w)                                                   (batch_normalize only)
        L = aggregate(keep · w · ℓ(ρ, A), mode)                            (REINFORCE carries w inside ℓ)

    The normalisers N (valid tokens), G (answered responses) and the batch normalisation's ``weight_total``
    are the minibatch's when given (micro-batches), else this call's.

    stats: correction/weight_mean (token mean of keep·w), correction/masked_frac and
    correction/truncated_frac (token fractions a keep-mask zeroes and a truncation changes), all over the
    minibatch's N; correction/masked_seq_frac (responses with every token masked, over G).
    """
    mask = mask.to(logp.dtype)
    old = behavior_logp if correction.bypass else old_logp
    if old is None:
        raise ValueError("a decoupled correction needs old_logp (π_old)")
    kappa = logp.detach() - behavior_logp
    x = kappa if correction.bypass else old - behavior_logp
    weight, keep, truncated = _behaviour(correction, x, kappa, mask, advantages)
    N = _token_count(mask, token_count, logp)
    answered = mask.sum(dim=-1) > 0  # responses with at least one token, as the aggregation's G counts
    G = _token_count(mask, answered.sum() if sequence_count is None else sequence_count, logp)
    if correction.batch_normalize:
        level = correction.weight
        total = behavior.weight_total(weight, mask, level) if weight_total is None else weight_total
        weight = behavior.batch_normalize(weight, total, N if level == "token" else G, level)
    per_token = _objective(correction, logp, logp - old, advantages, rewards, mask, behavior_logp, weight)
    scaled = keep * per_token if correction.objective == "reinforce" else keep * weight * per_token
    loss = aggregate(
        scaled, mask, correction.aggregation,
        token_count=token_count, sequence_count=sequence_count, scale=correction.scale,
    )  # fmt: skip
    dropped = answered & ((keep * mask).sum(dim=-1) == 0)
    stats = {
        "advantage": advantages,
        "correction/weight_mean": _token_sum_over(keep * weight, mask, N),
        "correction/masked_frac": _token_sum_over(keep == 0, mask, N),
        "correction/truncated_frac": _token_sum_over(truncated, mask, N),
        "correction/masked_seq_frac": dropped.sum() / G,
    }
    return LossOutput(loss, stats)


def corrected_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    group_size: int,
    correction: Correction,
    old_logp: Tensor | None = None,
    token_count: float | Tensor | None = None,
    sequence_count: float | Tensor | None = None,
    weight_total: Tensor | None = None,
) -> LossOutput:
    """A framework preset as a learner: `correction_loss` with GRPO's group advantage
    A_i = (r_i − mean r)/(std r + 1e-6) (SPEC.md GRPO; verl's and TRL's default estimator)."""
    _check_groups(rewards, group_size)
    A = _grpo_advantage(rewards, group_size)
    return correction_loss(
        logp, old_logp, behavior_logp, mask, A, rewards, correction,
        token_count=token_count, sequence_count=sequence_count, weight_total=weight_total,
    )  # fmt: skip
