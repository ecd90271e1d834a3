"""A framework's rollout correction composed from its parts.

SPEC-corrections.md writes each framework's loss as a per-token objective on a policy ratio, times a constant
behaviour weight and keep-masks, aggregated by a mode. `Correction` (`train.corrections`) names the parts;
`correction_loss` composes them, and `corrected_loss` is the learner (GRPO's group advantage, SPEC.md GRPO).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ggpo_offline.train.correction_presets import OBJECTIVES, Correction
from ggpo_offline.train.losses import behavior, objectives
from ggpo_offline.train.losses.aggregation import aggregate
from ggpo_offline.train.losses.common import (
    LossOutput,
    Max,
    _check_groups,
    _ratio,
    _token_count,
    _token_sum_over,
)
from ggpo_offline.train.losses.grpo import _grpo_advantage

if TYPE_CHECKING:
    from ggpo_offline.train.loss_inputs import MinibatchSource


def _rejections_keep(correction: Correction, x: Tensor, mask: Tensor) -> Tensor:
    """The product of the masks that take tokens out of the loss mask: verl's rejections (``rollout_rs``)
    and AReaL's M2 mask, both read on x in its own precision: [B, T]."""
    keep = torch.ones_like(x)
    for option, threshold in correction.rejections:
        keep = keep * behavior.rejection_keep(x, mask, option, threshold)
    if correction.second_moment is not None:
        keep = keep * behavior.second_moment_keep(x, mask, correction.second_moment)
    return keep


def _behaviour(
    correction: Correction, x: Tensor, weight_x: Tensor, kappa: Tensor, mask: Tensor, A: Tensor
) -> tuple:
    """(weight, keep, kept, truncated): the constant importance weight, read on ``weight_x`` (x, or x from
    float32 log-probs) and returned in x's dtype; the product of every keep-mask; the part of it that takes
    tokens out of the loss mask (`_rejections_keep`); where the truncation changed a weight; each [B, T]."""
    weight = keep = torch.ones_like(x)
    truncated = torch.zeros_like(x, dtype=torch.bool)
    low, high = correction.weight_low, correction.weight_high
    if correction.weight is not None:
        weight_mask = mask.to(weight_x.dtype)
        weight = behavior.log_weight(weight_x, weight_mask, correction.weight).exp()
        if correction.filter_level is not None:  # another level's ratio decides, the weight stays as it is
            ratio = behavior.log_weight(weight_x, weight_mask, correction.filter_level).exp()
            keep = behavior.inside(ratio, low, high).to(x.dtype)
        elif correction.truncate:
            raw, weight = weight, behavior.truncate(weight, low, high)
            truncated = weight != raw
        else:
            keep = behavior.inside(weight, low, high).to(x.dtype)
        weight = weight.to(x.dtype)
    kept = _rejections_keep(correction, x, mask)
    keep = keep * kept
    if correction.off_policy_delta is not None:
        keep = keep * behavior.off_policy_sequence_keep(kappa, mask, A, correction.off_policy_delta)
    return weight, keep, kept, truncated


def _log_ratio(
    correction: Correction, logp: Tensor | None, old_logp: Tensor | None, behavior_logp: Tensor
) -> tuple:
    """(x, weight_x): the behaviour log-ratio, κ = sg log π_θ − log μ in bypass mode else λ = log π_old −
    log μ, and the same from float32 log-probs where the correction reads its weight so (AReaL)."""
    if correction.bypass and logp is None:
        raise ValueError("a bypass correction reads its weights and rejections on π_θ/μ: give logp")
    numerator = logp.detach() if correction.bypass else old_logp
    if numerator is None:
        raise ValueError("a decoupled correction needs old_logp (π_old)")
    x = numerator - behavior_logp
    return x, (numerator.float() - behavior_logp.float() if correction.float32_ratio else x)


def kept_mask(
    correction: Correction, logp: Tensor | None, old_logp: Tensor | None, behavior_logp: Tensor, mask: Tensor
) -> Tensor:
    """The loss mask a `count_kept` correction aggregates over, ``mask`` times the keep of its rejections
    and M2 mask: the trainer counts it over a minibatch's micro-batches and ranks (N, G of the kept tokens).
    ``logp`` (π_θ, detached) is read only by a bypass correction's rejections (`reads_policy`)."""
    mask = mask.to(behavior_logp.dtype)
    if not correction.rejects:
        return mask
    x, _ = _log_ratio(correction, logp, old_logp, behavior_logp)
    return mask * _rejections_keep(correction, x, mask)


def reads_policy(correction: Correction) -> bool:
    """Whether `kept_mask` reads π_θ: a bypass correction's rejections are read on π_θ/μ."""
    return correction.bypass and correction.rejects


def minibatch_counts(
    correction: Correction, calls: list[dict[str, Tensor]], total: Callable[[Tensor], Tensor]
) -> dict[str, Tensor]:
    """What the loss of ``correction`` divides by beyond T_tok, counted over a minibatch before its first
    micro-batch's loss: each of ``calls`` holds one micro-batch's ``mask``, ``behavior_logp``, ``old_logp``
    (decoupled) and π_θ's ``logp`` (where `reads_policy`); ``total`` sums a count over the ranks. G and B; the
    kept tokens and responses of a `count_kept` correction; the weight total of a batch-normalised one."""
    counts = {
        "sequence_count": total(sum((call["mask"].sum(dim=1) > 0).sum() for call in calls)),
        "response_count": total(torch.tensor(sum(len(call["mask"]) for call in calls))),
    }
    c = correction
    if c.count_kept:
        kept = [x["mask"] for x in calls]
        if c.rejects:
            kept = [kept_mask(c, x.get("logp"), x.get("old_logp"), x["behavior_logp"], x["mask"])
                    for x in calls]  # fmt: skip
        counts["kept_token_count"] = total(sum(mask.sum() for mask in kept))
        counts["kept_sequence_count"] = total(sum((mask.sum(dim=1) > 0).sum() for mask in kept))
    if c.batch_normalize:
        parts = [weight_total(c, x["old_logp"], x["behavior_logp"], x["mask"]) for x in calls]
        counts["weight_total"] = total(torch.stack(parts).sum())
    return counts


def prepared_counts(correction: Correction, minibatch: "MinibatchSource") -> dict[str, Tensor]:
    """`minibatch_counts` of ``correction`` over ``minibatch``'s micro-batches, each read for what its
    counts need only: the mask; the constants where a rejection or the batch normalisation reads them; π_θ's
    log-probs where `reads_policy`."""
    calls = []
    for position in range(minibatch.micro_batches):
        call = {"mask": minibatch.mask(position)}
        if correction.rejects or correction.batch_normalize:
            call |= minibatch.constants(position)
        if reads_policy(correction):
            call["logp"] = minibatch.policy_logp(position)
        calls.append(call)
    return minibatch_counts(correction, calls, minibatch.total)


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
    response_count: float | Tensor | None = None,
    kept_token_count: float | Tensor | None = None,
    kept_sequence_count: float | Tensor | None = None,
    weight_total: Tensor | None = None,
) -> LossOutput:
    """SPEC-corrections.md's loss of ``correction`` for given advantages A [B]:

        λ = log π_old − log μ,  ρ = log π_θ − log π_old,  κ = λ + ρ        (bypass: π_old := μ, λ = 0)
        w, keep = behaviour(λ or sg κ)                                     (constants)
        w ← w / mean(w)                                                   (batch_normalize only)
        L = aggregate(keep · w · ℓ(ρ, A), M', mode)                        (REINFORCE carries w inside ℓ)

    M' is the loss mask the aggregation counts: M, or with `count_kept` M times the rejections' and M2's
    keep (§g: verl and AReaL divide by the tokens those keep; none kept: 0/0 = NaN, gradient 0, as verl).
    The counts are the whole minibatch's when given (micro-batches), else this call's: N valid tokens, G
    answered responses, B responses, and N, G of M' (``kept_token_count``, ``kept_sequence_count``); the
    batch normalisation's ``weight_total`` likewise.

    stats: correction/weight_mean (token mean of keep·w), correction/masked_frac and
    correction/truncated_frac (token fractions a keep-mask zeroes and a truncation changes), all over the
    minibatch's N; correction/masked_seq_frac (responses with every token masked, over G);
    correction/none_kept (1 where M' holds no token of the minibatch).
    """
    c = correction
    mask = mask.to(logp.dtype)
    x, weight_x = _log_ratio(c, logp, old_logp, behavior_logp)
    kappa = logp.detach() - behavior_logp
    weight, keep, kept, truncated = _behaviour(c, x, weight_x, kappa, mask, advantages)
    N = _token_count(mask, token_count, logp)
    answered = (mask.sum(dim=-1) > 0).sum()  # responses with a token, as the aggregation's G counts
    G = _token_count(mask, answered if sequence_count is None else sequence_count, logp)
    if c.batch_normalize:
        level = c.weight
        total = behavior.weight_total(weight, mask, level) if weight_total is None else weight_total
        weight = behavior.batch_normalize(weight, total, N if level == "token" else G, level)
    old = behavior_logp if c.bypass else old_logp
    per_token = _objective(c, logp, logp - old, advantages, rewards, mask, behavior_logp, weight)
    scaled = keep * per_token if c.objective == "reinforce" else keep * weight * per_token
    loss_mask, tokens, sequences = mask, token_count, sequence_count
    if c.count_kept:
        loss_mask, tokens, sequences = mask * kept, kept_token_count, kept_sequence_count
    loss = aggregate(
        scaled, loss_mask, c.aggregation, token_count=tokens, sequence_count=sequences,
        response_count=response_count, scale=c.scale, sequence_mean=c.sequence_mean,
    )  # fmt: skip
    none_kept = _token_count(loss_mask, tokens, logp) == 0
    return LossOutput(loss, _statistics(advantages, weight, keep, truncated, mask, N, G, none_kept))


def _statistics(
    A: Tensor, weight: Tensor, keep: Tensor, truncated: Tensor, mask: Tensor, N: Tensor, G: Tensor, none_kept
) -> dict:
    """`correction_loss`'s statistics (its docstring), token fractions over the minibatch's N."""
    dropped = (mask.sum(dim=-1) > 0) & ((keep * mask).sum(dim=-1) == 0)
    return {
        "advantage": A,
        "correction/weight_mean": _token_sum_over(keep * weight, mask, N),
        "correction/masked_frac": _token_sum_over(keep == 0, mask, N),
        "correction/truncated_frac": _token_sum_over(truncated, mask, N),
        "correction/masked_seq_frac": dropped.sum() / G,
        "correction/none_kept": Max(none_kept.to(mask.dtype)),
    }


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
    response_count: float | Tensor | None = None,
    kept_token_count: float | Tensor | None = None,
    kept_sequence_count: float | Tensor | None = None,
    weight_total: Tensor | None = None,
) -> LossOutput:
    """A framework preset as a learner: `correction_loss` with GRPO's group advantage
    A_i = (r_i − mean r)/(std r + 1e-6) (SPEC.md GRPO; verl's and TRL's default estimator)."""
    _check_groups(rewards, group_size)
    A = _grpo_advantage(rewards, group_size)
    return correction_loss(
        logp, old_logp, behavior_logp, mask, A, rewards, correction,
        token_count=token_count, sequence_count=sequence_count, response_count=response_count,
        kept_token_count=kept_token_count, kept_sequence_count=kept_sequence_count, weight_total=weight_total,
    )  # fmt: skip
