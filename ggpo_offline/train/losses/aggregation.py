"""The loss aggregation modes of SPEC-corrections.md §f (verl ``loss_agg_mode``), by global counts.

A trainer cuts a minibatch into micro-batches and sums their losses, so each mode divides by a count of the
whole minibatch, never by one of the call: ``token_count`` N (valid tokens) and ``sequence_count`` G
(responses with at least one token); None means this call's own count (the call is the whole minibatch).
"""

from torch import Tensor

from ggpo_offline.train.losses.common import _token_count

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    token_count: float | Tensor | None = None,
    sequence_count: float | Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """One scalar from per-token losses ℓ [B, T] (padding may hold anything finite):

    token-mean               Σ M ℓ / N
    seq-mean-token-sum       Σ_i Σ_t M ℓ / G
    seq-mean-token-mean      Σ_i (Σ_t M ℓ / (L_i + 1e-8)) / G
    seq-mean-token-sum-norm  Σ M ℓ / scale     (verl's loss_scale_factor; Dr. GRPO's constant)
    """
    mask = mask.to(loss.dtype)  # a bool mask's integer lengths would demote float64 math (+ 1e-8 is float32)
    per_sequence = (mask * loss).sum(dim=-1)  # [B]
    if mode == "token-mean":
        return per_sequence.sum() / _token_count(mask, token_count, loss)
    if mode == "seq-mean-token-sum-norm":
        if scale is None:
            raise ValueError("seq-mean-token-sum-norm needs a constant scale (Dr. GRPO: the response cap)")
        return per_sequence.sum() / scale
    sequences = (mask.sum(dim=-1) > 0).sum() if sequence_count is None else sequence_count
    G = _token_count(mask, sequences, loss)
    if mode == "seq-mean-token-sum":
        return per_sequence.sum() / G
    if mode == "seq-mean-token-mean":
        return (per_sequence / (mask.sum(dim=-1) + 1e-8)).sum() / G
    raise ValueError(f"unknown aggregation {mode!r}; choose from {', '.join(AGGREGATIONS)}")
