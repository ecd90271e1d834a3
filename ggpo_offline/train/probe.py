"""How far the policy has moved from π0, measured at every evaluated checkpoint on one fixed probe of pool
responses: the x-axis of a report's accuracy-against-drift frontier."""

import torch
from torch import Tensor

from ggpo_offline.train import diagnostics as diag
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import Ranks, all_sum, rank_groups
from ggpo_offline.train.metric_names import PROBE_K3, PROBE_LOG_RATIO
from ggpo_offline.train.minibatch import Minibatch, MinibatchReader
from ggpo_offline.train.pool_index import PoolIndex


def drift_probe(config: TrainConfig, reader: MinibatchReader, ranks: Ranks) -> "DriftProbe | None":
    """The run's probe of ``config.probe_groups`` groups (`probe_groups`), read from the pool; None when it
    has none or is not evaluated (the probe is measured at evaluated checkpoints only)."""
    if config.probe_groups == 0 or config.evaluation.eval_every is None:
        return None
    groups = probe_groups(reader.index, config.probe_groups, ranks)
    return DriftProbe(reader.read(groups), config.micro_batch_size, ranks)


def probe_groups(index: PoolIndex, groups: int, ranks: Ranks) -> list[int]:
    """The probe: the pool's first ``groups`` mixed-reward groups in pool order, the same for every run,
    method and seed of a pool (some runs also train on them: the probe measures how far the policy moved
    on responses π0 wrote, not what it generalises to); this rank's contiguous share of them."""
    return rank_groups([int(g) for g in index.mixed_group_ids[:groups]], ranks)


class DriftProbe:
    """The probe's micro-batches and π0's log-probs of them: taken from the first policy it measures, which
    is π0 when a run starts at update 0, and kept in the checkpoint for a resumed run (`Trainer.state`)."""

    def __init__(self, batch: Minibatch, micro_batch_size: int | None, ranks: Ranks):
        self.micros = batch.split(micro_batch_size)
        self.ranks = ranks
        self.pi0: list[Tensor] | None = None
        self.tokens = all_sum(batch.mask.sum(), ranks)
        self.responses = all_sum(torch.tensor(float(batch.num_responses)), ranks)

    @torch.no_grad()
    def measure(self, policy: torch.nn.Module, forward_tokens: int | None) -> dict[str, float]:
        """`PROBE_METRICS` of ``policy`` (`ResponseLogprobs`, wrapped or not): a no-gradient forward over
        the probe on every rank (FSDP2 needs all of them)."""
        policy.eval()
        try:
            logps = [policy(micro, forward_tokens=forward_tokens)[0].cpu() for micro in self.micros]
        finally:
            policy.train()
        return self.drift(logps)

    def drift(self, logps: list[Tensor]) -> dict[str, float]:
        """`PROBE_METRICS` of the policy whose log-probs of the probe's micro-batches are ``logps``,
        summed over micro-batches and ranks (0 for the first policy measured, π0 itself)."""
        if self.pi0 is None:
            self.pi0 = [logp.clone() for logp in logps]
        k3 = sum(
            diag.mismatch_k3(logp, pi0, micro.mask, token_count=self.tokens)
            for logp, pi0, micro in zip(logps, self.pi0, self.micros, strict=True)
        )
        log_ratio = sum(
            diag.ref_log_ratio(logp, pi0, micro.mask, response_count=self.responses)
            for logp, pi0, micro in zip(logps, self.pi0, self.micros, strict=True)
        )
        return {
            PROBE_K3: all_sum(k3, self.ranks).item(),
            PROBE_LOG_RATIO: all_sum(log_ratio, self.ranks).item(),
        }
