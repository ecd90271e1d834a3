"""One update's metrics: the diagnostics added micro-batch by micro-batch, then reduced over ranks once."""

import torch
from torch import Tensor

from ggpo_offline.train import diagnostics as diag
from ggpo_offline.train.distributed import Ranks, all_cat, all_max, all_sum
from ggpo_offline.train.losses import Derived, GroupMean, GroupWeights, LossOutput, Max, Stat
from ggpo_offline.train.metric_names import (
    AGE_METRICS,
    GRAD_NORM,
    LOSS,
    MISMATCH_DRIFT,
    MISMATCH_ESS,
    MISMATCH_ESS_BLOCK,
    MISMATCH_K3,
    POLICY_ENTROPY,
    Q_ESS,
    REF_LOG_RATIO,
    RESPONSE_LENGTH,
    REWARD,
    ROUND_ENTROPY,
    ROUND_ESS,
    ROUND_K3,
    ROUND_LENGTH,
    ROUND_RATIO_QUANTILES,
    SUCCESS_ESS,
    TRUNCATED_FRAC,
    k3_at_age,
    share_at_age,
)
from ggpo_offline.train.minibatch import Minibatch

SUMMED_METRICS = (LOSS, MISMATCH_K3, MISMATCH_DRIFT, POLICY_ENTROPY, REF_LOG_RATIO)
"""Per-minibatch diagnostics normalized by global counts: micro-batches and ranks add up."""


class EssBlock:
    """`mismatch/ess_block`: the sequence ESS over a block of ``size`` updates' log weights (all ranks' rows);
    ``log_weights`` is the unfinished block, which a checkpoint keeps."""

    def __init__(self, size: int):
        self.size = size
        self.log_weights: list[Tensor] = []

    def add(self, seq_log_weights: Tensor) -> float | None:
        """Add one update's log weights; the block's ESS when this update ends the block, else None."""
        self.log_weights.append(seq_log_weights.cpu())
        if len(self.log_weights) != self.size:
            return None
        ess = diag.sequence_ess(torch.cat(self.log_weights)).item()
        self.log_weights = []
        return ess


class RoundMismatch:
    """A round's mismatch under one policy (metric_names "round/"): K3, the sequence ESS and token-ratio
    quantiles over every response of the round, its entropy and length. `add` takes the policy's forward of
    each micro-batch, `metrics` reduces over all ranks (each measures its share)."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.sums = torch.zeros(3, dtype=torch.float64)  # K3, entropy and token count, summed
        self.log_ratios: list[Tensor] = []
        self.seq_log_weights: list[Tensor] = []
        self.lengths: list[Tensor] = []

    def add(self, logp: Tensor, entropy: Tensor, behavior_logp: Tensor, mask: Tensor) -> None:
        """One micro-batch's log-probs and entropies under the policy, its behavior log-probs and mask."""
        logp, entropy = logp.detach().cpu(), entropy.detach().cpu()
        behavior_logp, mask = behavior_logp.cpu(), mask.cpu()
        self.sums += torch.tensor(
            [
                diag.mismatch_k3(logp, behavior_logp, mask, token_count=1.0).item(),
                diag.token_entropy_mean(entropy, mask, token_count=1.0).item(),
                mask.sum().item(),
            ],
            dtype=torch.float64,
        )
        self.log_ratios.append((logp - behavior_logp)[mask.bool()])
        self.seq_log_weights.append(diag.sequence_log_weights(logp, behavior_logp, mask))
        self.lengths.append(mask.sum(dim=1))

    def metrics(self) -> dict[str, float]:
        """The `round/` metrics over every micro-batch added, on every rank."""
        k3, entropy, tokens = all_sum(self.sums, self.ranks).tolist()
        ratios = _all_tokens(torch.cat(self.log_ratios).double(), self.ranks).exp()
        levels = torch.tensor([q for _, q in ROUND_RATIO_QUANTILES], dtype=torch.float64)
        quantiles = torch.quantile(ratios, levels).tolist()
        return {
            ROUND_K3: k3 / tokens,
            ROUND_ESS: diag.sequence_ess(all_cat(torch.cat(self.seq_log_weights), self.ranks)).item(),
            **{name: q for (name, _), q in zip(ROUND_RATIO_QUANTILES, quantiles, strict=True)},
            ROUND_ENTROPY: entropy / tokens,
            ROUND_LENGTH: all_cat(torch.cat(self.lengths).double(), self.ranks).mean().item(),
        }


def _all_tokens(values: Tensor, ranks: Ranks) -> Tensor:
    """Every rank's token values, whose counts differ: padded with NaN to the longest, gathered, unpadded."""
    longest = int(all_max(torch.tensor(float(len(values))), ranks).item())
    padded = torch.cat([values, torch.full((longest - len(values),), float("nan"), dtype=values.dtype)])
    gathered = all_cat(padded, ranks)
    return gathered[~gathered.isnan()]


def age_metrics(ages: list[int]) -> dict[str, float]:
    """`AGE_METRICS` of a minibatch whose groups have ``ages``; where they differ, its histogram too
    (`share_at_age`)."""
    metrics = dict(zip(AGE_METRICS, (sum(ages) / len(ages), min(ages), max(ages)), strict=True))
    if len(set(ages)) > 1:
        metrics |= {share_at_age(age): ages.count(age) / len(ages) for age in sorted(set(ages))}
    return metrics


class StepDiagnostics:
    """The diagnostics of one update on (this rank's share of) one minibatch (SPEC.md "Diagnostics").

    `add` takes each micro-batch's log-probs, entropies and loss result. Token means divide by the global
    T_tok and ref/log_ratio by the global response count, so micro-batches and ranks add up (`reduce_sums`,
    which gives the loss before the step is taken); the ESS-like statistics and the learner's statistics are
    reduced over all ranks' rows by `metrics`, each learner statistic as its kind declares (`LossOutput`).
    """

    def __init__(
        self,
        token_count: Tensor,
        response_count: int,
        with_ref: bool,
        ranks: Ranks,
        ages: dict[int, int] | None = None,
        round_mismatch: RoundMismatch | None = None,
    ):
        """``token_count``: T_tok of the whole minibatch; ``response_count``: its responses on all ranks;
        ``with_ref``: the learner has a reference (ref/log_ratio is logged); ``ages``: group id → age, for a
        minibatch of several ages, whose K3 is then logged by age too (`k3_at_age`); ``round_mismatch``:
        the round this minibatch is all of, measured on the same forward (the policy before the step)."""
        self.token_count, self.response_count, self.ranks = token_count, response_count, ranks
        self.ages, self.round_mismatch = ages, round_mismatch
        self.by_age = torch.zeros(len(set((ages or {}).values())), 2, dtype=torch.float64)  # K3, tokens
        self.sums = dict.fromkeys([k for k in SUMMED_METRICS if with_ref or k != REF_LOG_RATIO], 0.0)
        self.seq_log_weights: list[Tensor] = []
        self.rewards: list[Tensor] = []  # in micro-batch order, like the learner's per-response statistics
        self.stats: list[dict[str, Stat]] = []

    def add(
        self,
        micro: Minibatch,
        logp: Tensor,
        entropy: Tensor,
        *,
        mask: Tensor,
        behavior_logp: Tensor,
        ref_logp: Tensor | None,
        loss: LossOutput,
    ) -> None:
        """One micro-batch: the policy's log-probs and entropies, its mask and constant log-probs (each
        [B, T], on the policy's device), and the learner's loss result."""
        logp, T_tok = logp.detach(), self.token_count
        self.sums[LOSS] += loss.loss.item()
        self.sums[MISMATCH_K3] += diag.mismatch_k3(logp, behavior_logp, mask, token_count=T_tok).item()
        self.sums[MISMATCH_DRIFT] += diag.mismatch_drift(logp, behavior_logp, mask, token_count=T_tok).item()
        self.sums[POLICY_ENTROPY] += diag.token_entropy_mean(entropy, mask, token_count=T_tok).item()
        if REF_LOG_RATIO in self.sums:
            self.sums[REF_LOG_RATIO] += diag.ref_log_ratio(
                logp, ref_logp, mask, response_count=self.response_count
            ).item()
        if self.ages is not None:
            self._add_by_age(micro, logp, behavior_logp, mask)
        if self.round_mismatch is not None:
            self.round_mismatch.add(logp, entropy, behavior_logp, mask)
        self.seq_log_weights.append(diag.sequence_log_weights(logp, behavior_logp, mask))
        self.rewards.append(micro.rewards)
        self.stats.append(loss.stats)

    def _add_by_age(self, micro: Minibatch, logp: Tensor, behavior_logp: Tensor, mask: Tensor) -> None:
        row_ages = torch.tensor([self.ages[g] for g in micro.group_ids for _ in range(micro.group_size)])
        for slot, age in enumerate(sorted(set(self.ages.values()))):
            rows = (row_ages == age).to(logp.device)
            if rows.any():
                k3 = diag.mismatch_k3(logp[rows], behavior_logp[rows], mask[rows], token_count=1.0)
                self.by_age[slot] += torch.tensor([k3.item(), mask[rows].sum().item()], dtype=torch.float64)

    def reduce_sums(self) -> dict[str, float]:
        """The summed diagnostics (the loss first) over micro-batches and ranks, in one reduction."""
        totals = all_sum(torch.tensor(list(self.sums.values()), dtype=torch.float64), self.ranks).tolist()
        self.sums = dict(zip(self.sums, totals, strict=True))
        return self.sums

    def metrics(
        self, batch: Minibatch, grad_norm: float, method: str, ess_block: EssBlock
    ) -> dict[str, float]:
        """The minibatch's metrics in their logged order, after `reduce_sums`: the sums, the sequence ESS,
        the gradient norm, the batch's rewards and lengths, the group-weight ESS, the learner's statistics
        (named by ``method``) and, at a block's end, the block ESS."""
        metrics = dict(self.sums)
        seq_log_weights = self._everyone(torch.cat(self.seq_log_weights))
        metrics[MISMATCH_ESS] = diag.sequence_ess(seq_log_weights).item()
        metrics[GRAD_NORM] = grad_norm
        metrics[REWARD] = self._everyone(batch.rewards).mean().item()
        metrics[RESPONSE_LENGTH] = self._everyone(batch.mask.sum(dim=1)).mean().item()
        metrics[TRUNCATED_FRAC] = self._everyone(batch.truncated.float()).mean().item()
        metrics.update(self._group_weight_metrics(batch.group_size))
        metrics.update(self._learner_metrics(method))
        block = ess_block.add(seq_log_weights)
        if block is not None:
            metrics[MISMATCH_ESS_BLOCK] = block
        if self.ages is not None:
            k3, tokens = all_sum(self.by_age, self.ranks).unbind(dim=1)
            for age, value in zip(sorted(set(self.ages.values())), (k3 / tokens).tolist(), strict=True):
                metrics[k3_at_age(age)] = value
        return metrics

    def _everyone(self, value: Tensor) -> Tensor:
        return all_cat(value, self.ranks)

    def _group_weight_metrics(self, group_size: int) -> dict[str, float]:
        """ggpo/q_ess and ggpo/success_ess from the learner's within-group weights (GGPO's q), if any."""
        metrics = {}
        for key, stat in self.stats[0].items():
            if isinstance(stat, GroupWeights):
                q = self._everyone(torch.cat([stats[key].value for stats in self.stats]))
                rewards = self._everyone(torch.cat(self.rewards))
                metrics[Q_ESS] = diag.q_ess_median(q, group_size).item()
                success = diag.success_ess(q, rewards, group_size)
                if success is not None:
                    metrics[SUCCESS_ESS] = success.item()
        return metrics

    def _learner_metrics(self, method: str) -> dict[str, float]:
        """The learner's statistics reduced as each declares; derived ones after those they derive from."""
        reduced, derived = {}, {}
        for key, stat in self.stats[0].items():
            if isinstance(stat, Derived):
                derived[key] = stat
            elif (value := self._reduce([stats[key] for stats in self.stats])) is not None:
                reduced[key] = value
        for key, stat in derived.items():
            reduced[key] = stat.derive(*(reduced[name] for name in stat.inputs))
        # Learner-specific keys are named by the method (grpo/clip_frac); shared families keep their own
        # prefix (pkl/credit_mean, is/w_max, cispo/clip_frac_low), as SPEC-beyond names them.
        return {key if "/" in key else f"{method}/{key}": value for key, value in reduced.items()}

    def _reduce(self, values: list[Stat]) -> float | None:
        """One statistic's micro-batch values reduced over micro-batches and ranks; None: not logged."""
        if isinstance(values[0], Max):
            return all_max(torch.stack(_float64(values)).amax(), self.ranks).item()
        if isinstance(values[0], GroupMean):
            return self._everyone(torch.cat(_float64(values))).mean().item()
        if isinstance(values[0], Tensor) and values[0].dim() == 0:  # normalized by global counts: adds up
            return all_sum(torch.stack(_float64(values)).sum(), self.ranks).item()
        return None  # per-response values and group weights


def _float64(values: list[Tensor | Max | GroupMean]) -> list[Tensor]:
    return [(value if isinstance(value, Tensor) else value.value).detach().double() for value in values]
