"""The loss aggregation modes of SPEC-corrections.md §f (verl ``loss_agg_mode``), by global counts.

A trainer cuts a minibatch into micro-batches and sums their losses, so each mode divides by a count of the
whole minibatch, never by one of the call: ``token_count`` N (valid tokens), ``sequence_count`` G (responses
with at least one token) and ``response_count`` B (every response); None means this call's own count (the
call is the whole minibatch).
"""

from torch import Tensor

from ggpo_offline.train.correction_presets import AGGREGATIONS, SEQUENCE_MEANS
from ggpo_offline.train.losses.common import _token_count


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    token_count: float | Tensor | None = None,
    sequence_count: float | Tensor | None = None,
    response_count: float | Tensor | None = None,
    scale: float | None = None,
    sequence_mean: str = "verl",
) -> Tensor:
    """One scalar from per-token losses ℓ [B, T] (padding may hold anything), S_i = Σ_t M ℓ:

    token-mean               Σ M ℓ / N
    seq-mean-token-sum       Σ_i S_i / G
    seq-mean-token-mean      Σ_i S_i / (L_i + 1e-8) / G
    seq-mean-token-sum-norm  Σ M ℓ / scale     (verl's loss_scale_factor; Dr. GRPO's constant)

    or with TRL's sequence mean (``sequence_mean``, `SEQUENCE_MEANS`) max(L_i, 1) for L_i + 1e-8 and B for G.
    """
    mask = mask.to(loss.dtype)  # a bool mask's integer lengths would demote float64 math (+ 1e-8 is float32)
    # Masked tokens pass no gradient even where the count is 0 (0/0, verl's NaN loss): its gradient is 0.
    per_sequence = (mask * loss.where(mask > 0, 0.0)).sum(dim=-1)  # [B]
    if mode == "token-mean":
        return per_sequence.sum() / _token_count(mask, token_count, loss)
    if mode == "seq-mean-token-sum-norm":
        if scale is None:
            raise ValueError("seq-mean-token-sum-norm needs a constant scale (Dr. GRPO: the response cap)")
        return per_sequence.sum() / scale
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; choose from {', '.join(AGGREGATIONS)}")
    if sequence_mean not in SEQUENCE_MEANS:
        raise ValueError(f"unknown sequence mean {sequence_mean!r}; choose from {', '.join(SEQUENCE_MEANS)}")
    lengths = mask.sum(dim=-1)
    if sequence_mean == "trl":
        count = _token_count(mask, len(lengths) if response_count is None else response_count, loss)
    else:
        count = _token_count(mask, (lengths > 0).sum() if sequence_count is None else sequence_count, loss)
    if mode == "seq-mean-token-mean":
        per_sequence = per_sequence / (lengths.clamp(min=1) if sequence_mean == "trl" else lengths + 1e-8)
    return per_sequence.sum() / count
