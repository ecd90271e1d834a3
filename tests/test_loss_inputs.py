"""What the trainer hands a learner: `Learner.prepare` counts a minibatch over its micro-batches, reading
only what the learner's counts need, and `Learner.loss_on` passes those counts and the learner's constants
to its loss, so that the micro-batches' losses add up to the whole minibatch's; and PPO's dual clip, written
once for GRPO and the correction presets."""

from dataclasses import replace

import pytest
import torch
from test_corrections import _group_batch

from ggpo_offline.train.learners import LEARNERS
from ggpo_offline.train.loss_inputs import LossInputs, MinibatchCounts
from ggpo_offline.train.losses import composed, grpo_loss, objectives

F64 = torch.float64


class FakeMinibatch:
    """A `MinibatchSource` over two row halves of one batch (one rank), recording what the learner reads."""

    def __init__(self, seed: int = 0):
        self.logp, self.old_logp, self.behavior_logp, self.full_mask, self.rewards, self.m = _group_batch(
            seed
        )
        self.halves = [slice(0, 2 * self.m), slice(2 * self.m, None)]
        self.token_count = self.full_mask.sum()
        self.micro_batches = len(self.halves)
        self.read: list[str] = []

    def mask(self, position: int) -> torch.Tensor:
        self.read.append("mask")
        return self.full_mask[self.halves[position]]

    def constants(self, position: int) -> dict[str, torch.Tensor]:
        self.read.append("constants")
        rows = self.halves[position]
        return {"behavior_logp": self.behavior_logp[rows], "old_logp": self.old_logp[rows]}

    def policy_logp(self, position: int) -> torch.Tensor:
        self.read.append("policy_logp")
        return self.logp[self.halves[position]].detach()

    def total(self, count: torch.Tensor) -> torch.Tensor:
        self.read.append("total")
        return count


def _micro_losses(name: str, source: FakeMinibatch, counts: MinibatchCounts) -> tuple[float, torch.Tensor]:
    """The summed loss and gradient of ``name``'s micro-batches, each called as the trainer calls it."""
    entry = LEARNERS[name]
    logp = source.logp.clone().requires_grad_()
    total = 0.0
    for rows in source.halves:
        inputs = LossInputs(
            logp=logp[rows], mask=source.full_mask[rows], rewards=source.rewards[rows], group_size=source.m,
            counts=counts, behavior_logp=source.behavior_logp[rows], old_logp=source.old_logp[rows],
        )  # fmt: skip
        out = entry.loss_on(inputs, entry.loss_kwargs(None))
        out.loss.backward()
        total += out.loss.item()
    return total, logp.grad


def _whole_loss(name: str, source: FakeMinibatch) -> float:
    correction = LEARNERS[name].correction_preset.correction
    out = composed.corrected_loss(
        source.logp, source.behavior_logp, source.full_mask, source.rewards, group_size=source.m,
        correction=correction, old_logp=source.old_logp,
    )  # fmt: skip
    return out.loss.item()


def test_a_batch_normalised_presets_micro_batches_read_the_hooks_total_and_add_up_to_the_whole_minibatch():
    name = "verl-decoupled-token-is-norm"
    source = FakeMinibatch()
    counts = LEARNERS[name].prepare(source)
    assert counts.weight_total is not None and counts.kept_token_count is not None
    loss, _ = _micro_losses(name, source, counts)
    assert loss == pytest.approx(_whole_loss(name, source), abs=1e-12)
    # The total the hook counted is what the loss divides by: a wrong one changes the loss.
    wrong, _ = _micro_losses(name, source, replace(counts, weight_total=counts.weight_total * 1.5))
    assert wrong != pytest.approx(loss, abs=1e-6)
    # Each micro-batch's own total (no hook) is not the minibatch's either.
    alone, _ = _micro_losses(name, source, replace(counts, weight_total=None))
    assert alone != pytest.approx(loss, abs=1e-6)


def test_a_rejecting_presets_kept_token_count_reaches_its_loss():
    name = "verl-decoupled-geo-rs"
    source = FakeMinibatch()
    counts = LEARNERS[name].prepare(source)
    assert 0 < counts.kept_token_count < counts.token_count
    loss, _ = _micro_losses(name, source, counts)
    assert loss == pytest.approx(_whole_loss(name, source), abs=1e-12)
    wrong, _ = _micro_losses(name, source, replace(counts, kept_token_count=counts.token_count))
    assert wrong != pytest.approx(loss, abs=1e-6)


@pytest.mark.parametrize(
    "name, reads",
    [
        ("verl-decoupled-token-is", ["mask", "mask", "total", "total", "total", "total"]),
        ("verl-decoupled-token-is-norm", ["mask", "constants", "mask", "constants"] + ["total"] * 5),
        ("verl-bypass-ppo-clip-geo-rs", ["mask", "constants", "policy_logp"] * 2 + ["total"] * 4),
    ],
)
def test_the_hook_reads_only_what_the_learners_counts_need(name, reads):
    source = FakeMinibatch()
    LEARNERS[name].prepare(source)
    assert source.read == reads


def test_a_core_learners_counts_are_the_token_count_alone():
    source = FakeMinibatch()
    counts = LEARNERS["ggpo"].prepare(source)
    assert counts == MinibatchCounts(source.token_count)
    assert counts.given() == {"token_count": source.token_count} and source.read == []


def test_a_loss_gets_only_the_constants_its_learner_needs():
    """GRPO reads μ and π_ref, not π_old: a π_old in the inputs is not passed (grpo_loss takes none)."""
    logp, old_logp, behavior_logp, mask, rewards, m = _group_batch()
    ref_logp = behavior_logp - 0.1
    inputs = LossInputs(
        logp=logp, mask=mask, rewards=rewards, group_size=m, counts=MinibatchCounts(mask.sum()),
        behavior_logp=behavior_logp, old_logp=old_logp, ref_logp=ref_logp,
    )  # fmt: skip
    settings = {"clip_eps": 0.2, "dual_clip": 3.0, "kl_coef": 0.05}
    expected = grpo_loss(logp, behavior_logp, ref_logp, mask, rewards, group_size=m, **settings)
    assert LEARNERS["grpo"].loss_on(inputs, settings).loss.item() == expected.loss.item()


def test_the_dual_clip_bounds_a_negative_advantages_loss_and_passes_a_tie_whole():
    """SPEC.md GRPO's pg_t: max(−A ρ, −A clip(ρ, 1−ε_l, 1+ε_h)), then min(·, −A·c) where A < 0."""
    ratio = torch.tensor([[0.5, 1.0, 1.5, 5.0], [0.5, 1.0, 1.5, 5.0]], dtype=F64)
    A = torch.tensor([1.0, -1.0], dtype=F64)
    out = objectives.ppo_dual_clip(ratio, A, 0.2, 0.2, 3.0)
    assert out.pg.tolist() == [[-0.5, -1.0, -1.2, -1.2], [0.8, 1.0, 1.5, 3.0]]
    assert out.clipped.tolist() == [[False, False, True, True], [True, False, False, False]]
    assert out.dual_clipped.tolist() == [[False] * 4, [False, False, False, True]]
    plain = objectives.ppo_dual_clip(ratio, A, 0.2, 0.2, None)
    assert plain.pg.tolist() == [[-0.5, -1.0, -1.2, -1.2], [0.8, 1.0, 1.5, 5.0]]
    assert not plain.dual_clipped.any()
    assert objectives.ppo_dual_clip(ratio, A, 0.1, 0.3, None).pg[0].tolist() == [-0.5, -1.0, -1.3, -1.3]
    # On the log scale the corrections take, the same numbers.
    assert torch.allclose(objectives.ppo(ratio.log(), A, 0.2, 0.2, 3.0), out.pg, rtol=1e-15, atol=0)
    # At ρ = c exactly the bound is not taken: the gradient of −A ρ is whole, and 0 above the bound.
    at_bound = torch.tensor([[3.0, 4.0]], dtype=F64, requires_grad=True)
    objectives.ppo_dual_clip(at_bound, torch.tensor([-1.0], dtype=F64), 0.2, 0.2, 3.0).pg.sum().backward()
    assert at_bound.grad.tolist() == [[1.0, 0.0]]
