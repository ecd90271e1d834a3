"""The learners as pure functions of tensors: SPEC.md's five, SPEC-beyond's, and the RFT control.

SPEC.md: GGPO, GGPO-clip, AGRO (`ggpo`), GRPO, GRPO+TIS (`grpo`). SPEC-beyond.md: Proximal KL (PG is its β = 0
case), CISPO, sequence-level IS, IS-free (`proximal`), GGPO reward-only weights (`ggpo`). The RFT control
(`rft`) and GGPO's bounded-push ablation (`ggpo`). The frameworks' rollout corrections (SPEC-corrections.md),
composed from parts (`behavior`, `objectives`, `aggregation`) by `corrected`. What they share — the named
result, its statistic kinds and the tensor helpers — is in `common`.

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
are normalized the same way, so they sum over micro-batches; a stat of another kind says by its type how it
is reduced (`LossOutput`).
"""

from ggpo_offline.train.losses.common import (
    LOG_RATIO_BOUND,
    Derived,
    GroupMean,
    GroupWeights,
    LossOutput,
    Max,
    Stat,
)
from ggpo_offline.train.losses.composed import corrected_loss
from ggpo_offline.train.losses.ggpo import (
    agro_loss,
    ggpo_bounded_push_loss,
    ggpo_clip_loss,
    ggpo_loss,
    ggpo_reward_only_loss,
)
from ggpo_offline.train.losses.grpo import grpo_loss, grpo_tis_loss
from ggpo_offline.train.losses.proximal import (
    NonFiniteCoefficient,
    cispo_loss,
    is_free_loss,
    proximal_kl_loss,
    seq_is_loss,
)
from ggpo_offline.train.losses.rft import rft_loss

__all__ = [
    "LOG_RATIO_BOUND",
    "Derived",
    "GroupMean",
    "GroupWeights",
    "LossOutput",
    "Max",
    "NonFiniteCoefficient",
    "Stat",
    "agro_loss",
    "cispo_loss",
    "corrected_loss",
    "ggpo_bounded_push_loss",
    "ggpo_clip_loss",
    "ggpo_loss",
    "ggpo_reward_only_loss",
    "grpo_loss",
    "grpo_tis_loss",
    "is_free_loss",
    "proximal_kl_loss",
    "rft_loss",
    "seq_is_loss",
]
