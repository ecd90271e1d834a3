"""Behaviour corrections of SPEC-corrections.md: importance weights and rejection masks from a log-ratio.

Every function here is a constant of the loss (`sg`): it takes a detached log-ratio x (λ = log π_old − log μ
in decoupled mode, κ = log π_θ − log μ in bypass mode) and returns a weight or a keep-mask [B, T]; a
sequence-level one is the same value on every token of its response. Shapes as in `losses.__init__`.
"""

import math

import torch
from torch import Tensor

from ggpo_offline.train.correction_presets import RATIO_LEVELS, REJECTION_LEVELS, REJECTION_STATISTICS
from ggpo_offline.train.losses.common import LOG_RATIO_BOUND, _seq_sum


def _lengths(mask: Tensor) -> Tensor:
    """L_i = Σ_t M_t per response: [B]."""
    return mask.sum(dim=-1)


def log_weight(x: Tensor, mask: Tensor, level: str) -> Tensor:
    """The log of the importance weight at ``level`` (`RATIO_LEVELS`), clipped to ±20 as verl does before
    it exponentiates, on every token: [B, T]. Padding keeps finite values (masked later)."""
    x = mask * x
    if level == "token":
        per_token = x
    elif level == "sequence":
        per_token = x.sum(dim=-1, keepdim=True).expand_as(x)
    elif level == "geometric":
        lengths = _lengths(mask).clamp(min=1)[:, None]
        per_token = (x.sum(dim=-1, keepdim=True) / lengths).expand_as(x)
    else:
        raise ValueError(f"unknown ratio level {level!r}; choose from {', '.join(RATIO_LEVELS)}")
    return per_token.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def truncate(weight: Tensor, low: float | None, high: float | None) -> Tensor:
    """Weights clamped into [low, high] (TIS; TRL ``*_truncate``, OpenRLHF ``tis``); None: that side open."""
    return weight.clamp(min=low, max=high)


def weight_total(weight: Tensor, mask: Tensor, level: str) -> Tensor:
    """What verl's ``rollout_is_batch_normalize`` averages, summed: Σ_t M_t·w_t over the valid tokens for a
    token weight; for a sequence weight, Σ_i w_i over the responses with a valid token, each w_i read as
    verl reads it, the response's token mean Σ_t M_t·w_t / (L_i + 1e-8)."""
    if level == "token":
        return (mask * weight).sum()
    lengths = _lengths(mask)
    per_response = (mask * weight).sum(dim=-1) / (lengths + 1e-8)
    return per_response[lengths > 0].sum()


def batch_normalize(weight: Tensor, total: Tensor, count: Tensor, level: str) -> Tensor:
    """verl's batch-normalised IS weight (SPEC-corrections §a): w / mean, the mean ``total`` /
    (N + 1e-8) over tokens or ``total`` / max(G, 1e-8) over responses (`weight_total`; N valid tokens, G
    answered responses, both the minibatch's); unchanged where the mean is ≤ 1e-8. It can exceed the cap."""
    mean = total / (count + 1e-8) if level == "token" else total / count.clamp(min=1e-8)
    return torch.where(mean > 1e-8, weight / mean, weight)


def inside(value: Tensor, low: float | None, high: float | None) -> Tensor:
    """1 where low ≤ value ≤ high, else 0 (a None bound is open): the keep-mask of a ``*_mask`` weight
    (TRL), ``icepop`` and ``seq-mask-tis`` (OpenRLHF, read on the geometric mean), AReaL's mask action."""
    keep = torch.ones_like(value, dtype=torch.bool)
    if low is not None:
        keep &= value >= low
    if high is not None:
        keep &= value <= high
    return keep.to(value.dtype)


def rejection_statistic(x: Tensor, statistic: str) -> Tensor:
    """verl's per-token statistic of λ clipped to ±20: k1 = −λ, k2 = λ²/2, k3 = e^λ − 1 − λ: [B, T]."""
    x = x.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if statistic == "k1":
        return -x
    if statistic == "k2":
        return x**2 / 2
    if statistic == "k3":
        return torch.expm1(x) - x
    raise ValueError(
        f"unknown rejection statistic {statistic!r}; choose from {', '.join(REJECTION_STATISTICS)}"
    )


def rejection_keep(x: Tensor, mask: Tensor, option: str, threshold: float | tuple[float, float]) -> Tensor:
    """verl's rollout rejection (``rollout_rs``) for one option ``{level}_{k1|k2|k3}``: the keep-mask [B, T].

    k2/k3 keep a statistic ≤ ``threshold``. k1 takes bounds (lo, hi) and keeps log lo ≤ −λ ≤ log hi, a bound
    on μ/π_old (so (0.8, 1.5) keeps π_old/μ in [0.667, 1.25]); the logs are float64 (`math.log`), as verl's,
    so a statistic 2e-8 past log 1.001 is rejected. A sequence level rejects whole responses: seq_sum
    Σ_t M k, seq_mean Σ_t M k / (L + 1e-8), seq_max max_t over valid tokens.
    """
    level, _, statistic = option.rpartition("_")
    if level not in REJECTION_LEVELS:
        raise ValueError(f"unknown rejection option {option!r}; levels are {', '.join(REJECTION_LEVELS)}")
    per_token = rejection_statistic(x, statistic)
    if level == "token":
        value = per_token
    elif level == "seq_max":
        value = per_token.masked_fill(mask == 0, -torch.inf).amax(dim=-1, keepdim=True)
    else:
        value = _seq_sum(per_token, mask)[:, None]
        if level == "seq_mean":
            value = value / (_lengths(mask)[:, None] + 1e-8)
    if statistic == "k1":
        low, high = threshold
        keep = inside(value, math.log(low), math.log(high))
    else:
        keep = (value <= threshold).to(x.dtype)
    return keep.expand_as(x)


def second_moment_keep(x: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """AReaL's M2PO mask (``actor.m2_threshold`` τ): over the call's valid tokens, drop the largest λ² until
    the mean of the rest is below τ, keeping at least one token: [B, T]."""
    squares = (x**2)[mask > 0]
    ordered = squares.sort().values  # ascending: the kept tokens are a prefix
    running_mean = ordered.cumsum(0) / torch.arange(1, len(ordered) + 1, dtype=x.dtype, device=x.device)
    kept = max(int((running_mean < threshold).sum()), 1)
    # Ties at the cut keep the earliest tokens, like a stable descending sort that drops from the top.
    order = torch.argsort(squares, stable=True)
    keep_valid = torch.zeros_like(squares)
    keep_valid[order[:kept]] = 1
    keep = torch.zeros_like(x)
    keep[mask > 0] = keep_valid
    return keep


def off_policy_sequence_keep(x: Tensor, mask: Tensor, advantages: Tensor, delta: float) -> Tensor:
    """TRL's off-policy sequence mask (``off_policy_mask_threshold`` δ, DeepSeek-V3.2): drop a response with
    A < 0 whose mean log μ − log π_θ exceeds δ; ``x`` is κ = log π_θ − log μ: [B, T]."""
    mean_gap = _seq_sum(-x, mask) / _lengths(mask).clamp(min=1)
    keep = (advantages >= 0) | (mean_gap <= delta)
    return keep.to(x.dtype)[:, None].expand_as(x)
