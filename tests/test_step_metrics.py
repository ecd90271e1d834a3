"""One update's metrics: micro-batches add up to the whole minibatch; each statistic reduces as declared."""

import pytest
import torch

from ggpo_offline.train.diagnostics import sequence_ess
from ggpo_offline.train.distributed import SINGLE_PROCESS
from ggpo_offline.train.losses import LossOutput, ggpo_loss, seq_is_loss
from ggpo_offline.train.minibatch import Minibatch
from ggpo_offline.train.update_metrics import EssBlock, StepDiagnostics

G, M, T = 4, 3, 5
MICRO_BATCHES = [[2], [0, 3], [1]]  # group indices of each micro-batch, in order


def minibatch(seed: int = 0) -> tuple[Minibatch, dict[str, torch.Tensor]]:
    """G groups of M responses (float64) and the learner's log-probs, reference log-probs and entropies."""
    gen = torch.Generator().manual_seed(seed)
    B = G * M
    mask = (torch.arange(T) < torch.randint(1, T + 1, (B,), generator=gen)[:, None]).to(torch.float64)
    batch = Minibatch(
        input_ids=torch.zeros(B, T + 1, dtype=torch.long),
        attention_mask=torch.cat([torch.ones(B, 1), mask], dim=1).long(),
        prompt_lengths=torch.ones(B, dtype=torch.long),
        response_ids=torch.zeros(B, T, dtype=torch.long),
        mask=mask,
        behavior_logp=-2 * torch.rand(B, T, generator=gen, dtype=torch.float64),
        rewards=torch.tensor([1.0, 0.0, 1.0] * G, dtype=torch.float64),
        truncated=torch.zeros(B, dtype=torch.bool),
        group_ids=list(range(G)),
        group_size=M,
    )
    tensors = {
        "logp": batch.behavior_logp + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64),
        "ref_logp": batch.behavior_logp + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64),
        "entropy": torch.rand(B, T, generator=gen, dtype=torch.float64),
    }
    return batch, tensors


def micro_batch(batch: Minibatch, tensors: dict, groups: list[int]) -> tuple[Minibatch, dict]:
    """The micro-batch of ``groups`` and its rows of ``tensors``."""
    micro = batch._groups(groups)
    rows = torch.tensor([g * M + i for g in groups for i in range(M)])
    return micro, {key: value[rows, : micro.mask.shape[1]] for key, value in tensors.items()}


def loss(method: str, micro: Minibatch, rows: dict, token_count=None) -> LossOutput:
    logp, ref, settings = rows["logp"], rows["ref_logp"], {"group_size": M, "beta": 0.5}
    if method == "ggpo":
        return ggpo_loss(logp, ref, micro.mask, micro.rewards, token_count=token_count, **settings)
    return seq_is_loss(
        logp,
        micro.behavior_logp,
        ref,
        micro.mask,
        micro.rewards,
        horizon=2,
        token_count=token_count,
        **settings,
    )


def step_metrics(method: str, micro_batches: list[list[int]]) -> dict[str, float]:
    """The metrics of one update cut into ``micro_batches``."""
    batch, tensors = minibatch()
    token_count = batch.mask.sum()
    diagnostics = StepDiagnostics(token_count, batch.num_responses, with_ref=True, ranks=SINGLE_PROCESS)
    for groups in micro_batches:
        micro, rows = micro_batch(batch, tensors, groups)
        out = loss(method, micro, rows, token_count)
        diagnostics.add(
            micro,
            rows["logp"],
            rows["entropy"],
            mask=micro.mask,
            behavior_logp=micro.behavior_logp,
            ref_logp=rows["ref_logp"],
            loss=out,
        )
    diagnostics.reduce_sums()
    return diagnostics.metrics(batch, grad_norm=1.5, method=method, ess_block=EssBlock(8))


@pytest.mark.parametrize("method", ["ggpo", "seq-is"])
def test_micro_batches_give_the_whole_minibatch_metrics(method):
    whole = step_metrics(method, [[0, 1, 2, 3]])
    parts = step_metrics(method, MICRO_BATCHES)
    assert list(parts) == list(whole)  # the same keys in the same (logged) order
    for key, value in whole.items():
        assert parts[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_each_statistic_reduces_as_its_kind_declares():
    batch, tensors = minibatch()
    ggpo = step_metrics("ggpo", MICRO_BATCHES)
    full = loss("ggpo", batch, tensors)
    assert ggpo["ggpo/group_loss"] == pytest.approx(full.stats["group_loss"].value.mean().item(), rel=1e-12)
    assert "ggpo/q" not in ggpo and "ggpo/adjusted_reward" not in ggpo  # per-response values: not logged
    assert 1 <= ggpo["ggpo/q_ess"] <= M  # derived from the group weights q instead

    seq = step_metrics("seq-is", MICRO_BATCHES)
    w_max = [
        loss("seq-is", *micro_batch(batch, tensors, groups)).stats["is/w_max"] for groups in MICRO_BATCHES
    ]
    w_max = [stat.value.item() for stat in w_max]
    assert len(set(w_max)) > 1 and seq["is/w_max"] == max(w_max)  # the maximum, not the sum
    assert seq["pkl/credit_var"] == seq["pkl/credit_square_mean"] - seq["pkl/credit_mean"] ** 2
    assert list(seq)[-1] == "pkl/credit_var"  # derived after the statistics it derives from
    assert "seq-is/advantage" not in seq


def test_ess_block_reports_at_the_block_end_only():
    block = EssBlock(3)
    weights = [torch.tensor([0.0, 1.0]), torch.tensor([-1.0, 0.5]), torch.tensor([2.0, 0.0])]
    assert block.add(weights[0]) is None and block.add(weights[1]) is None
    assert block.add(weights[2]) == pytest.approx(sequence_ess(torch.cat(weights)).item(), rel=1e-12)
    assert block.log_weights == []
    assert block.add(weights[0]) is None and len(block.log_weights) == 1
