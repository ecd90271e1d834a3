"""The rejection-sampling fine-tuning control: the NLL of the correct responses, T_tok-normalized."""

from torch import Tensor

from ggpo_offline.train.losses.common import LossOutput, _check_groups, _token_count, _token_sum_over


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
