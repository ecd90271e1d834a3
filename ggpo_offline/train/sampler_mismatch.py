"""A pool's sampler against the learner before any update: the mismatch a dose makes, in the field's measures.

λ_t = log π0(a_t) − log μ(a_t) on every response token of the pool's mixed groups: π0 the initial model with
the learner's numerics and temperature (the π0 cache, `score_pool`), μ the engine's stored log-probs. When
the engine computes what the learner computes, λ is rounding alone; a bf16 engine, a temperature the learner
does not apply (generate-pool --learner-temperature) or a truncated sampler (--top-p, --top-k) make it the
training-inference mismatch the frameworks' corrections exist for. Each measure is reported under its own
name and under the name the field logs it by, so a dose reads against the figures frameworks publish.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from ggpo_offline.train import diagnostics as diag
from ggpo_offline.train.metric_names import SAMPLER_FIELDS, SAMPLER_METRICS

if TYPE_CHECKING:
    from ggpo_offline.train.pi0_cache import Pi0Cache
    from ggpo_offline.train.pool_index import CheckedPool

RATIO_BOUNDS = (0.5, 2.0)
"""The token-ratio band `SamplerMismatch.outside` counts outside of (IcePop's and verl's token-mask bounds
are of this order: SPEC-corrections)."""


@dataclass(frozen=True)
class SamplerMismatch:
    """The mismatch of a pool's responses between the sampler and the learner before any update."""

    abs_log_ratio: float
    """Token mean of |λ_t|: the field's "mean |Δ log π|" (0.011 for vLLM against Megatron on Qwen3-4B,
    0.036 on an SGLang path: vllm-project/vime #64)."""
    k3: float
    """Token mean of exp(λ_t) − λ_t − 1 (SPEC `mismatch/k3`): NeMo-RL's ``gen_kl_error`` (its default k3,
    log ratio learner − generation)."""
    probs_diff: float
    """Token mean of |π0(a_t) − μ(a_t)|: verl's ``training/rollout_probs_diff_mean``."""
    mult_prob_error: float
    """Token mean of exp(|λ_t|): NeMo-RL's ``token_mult_prob_error`` (1 when the two agree)."""
    ess: float
    """Normalized sequence ESS of exp(Σ_t λ_t) over every response (SPEC `mismatch/ess`)."""
    ratio_p05: float
    ratio_p50: float
    ratio_p95: float
    """Quantiles of the token ratio exp(λ_t)."""
    outside: float
    """Share of tokens whose ratio exp(λ_t) lies outside `RATIO_BOUNDS`."""
    responses: int
    tokens: int

    def metrics(self) -> dict[str, float]:
        """The measures under their metric names (`SAMPLER_METRICS`, in order), as a run logs them."""
        fields = zip(SAMPLER_METRICS, SAMPLER_FIELDS, strict=True)
        return {name: getattr(self, field) for name, field in fields}


@torch.no_grad()
def measure(logp: Tensor, behavior_logp: Tensor, mask: Tensor) -> SamplerMismatch:
    """The measures of responses ``[B, T]`` (``mask`` 1 on response tokens), computed in float64."""
    logp, behavior_logp, mask = logp.double(), behavior_logp.double(), mask.double()
    on = mask.bool()
    log_ratio = (logp - behavior_logp)[on]
    ratio = log_ratio.exp()
    quantiles = torch.quantile(ratio, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
    low, high = RATIO_BOUNDS
    return SamplerMismatch(
        abs_log_ratio=diag.mismatch_drift(logp, behavior_logp, mask).item(),
        k3=diag.mismatch_k3(logp, behavior_logp, mask).item(),
        probs_diff=(logp.exp() - behavior_logp.exp())[on].abs().mean().item(),
        mult_prob_error=log_ratio.abs().exp().mean().item(),
        ess=diag.sequence_ess(diag.sequence_log_weights(logp, behavior_logp, mask)).item(),
        ratio_p05=quantiles[0],
        ratio_p50=quantiles[1],
        ratio_p95=quantiles[2],
        outside=((ratio < low) | (ratio > high)).double().mean().item(),
        responses=int(mask.shape[0]),
        tokens=int(on.sum()),
    )


def pool_mismatch(pool: "CheckedPool", cache: "Pi0Cache") -> SamplerMismatch:
    """The measures over every response of the pool's mixed groups, π0's log-probs read from its cache: no
    forward pass."""
    from ggpo_offline.train.minibatch import MinibatchReader
    from ggpo_offline.train.pi0_cache import GROUPS_PER_PASS

    reader = MinibatchReader(pool.source, pool.index, pad_id=0)
    groups = pool.index.mixed_group_ids.tolist()
    passes = []
    for start in range(0, len(groups), GROUPS_PER_PASS):
        batch = reader.read(groups[start : start + GROUPS_PER_PASS])
        passes.append((cache.logprobs(batch), batch.behavior_logp, batch.mask))
    width = max(mask.shape[1] for *_, mask in passes)
    logp, behavior_logp, mask = (
        torch.cat([F.pad(tensor, (0, width - tensor.shape[1])) for tensor in column])
        for column in zip(*passes, strict=True)
    )
    return measure(logp, behavior_logp, mask)
