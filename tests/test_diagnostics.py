"""SPEC.md diagnostics: fixed points, hand-computed values and micro-batch accumulation."""

import math

import pytest
import torch

from ggpo_offline.train.diagnostics import (
    mismatch_drift,
    mismatch_k3,
    q_ess_median,
    ref_log_ratio,
    sequence_ess,
    sequence_log_weights,
    success_ess,
    token_entropy,
    token_entropy_mean,
)


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def random_batch(B: int = 8, T: int = 5, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    logp = -2 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    behavior = logp + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = (torch.arange(T) < torch.randint(1, T + 1, (B,), generator=gen)[:, None]).to(torch.float64)
    return logp, behavior, mask


def test_no_mismatch_when_learner_equals_behavior():
    logp, _, mask = random_batch()
    assert mismatch_k3(logp, logp, mask) == 0
    assert mismatch_drift(logp, logp, mask) == 0
    assert sequence_ess(sequence_log_weights(logp, logp, mask)).item() == pytest.approx(1.0, abs=1e-12)


def test_mismatch_by_hand():
    # λ on valid tokens: 0.5, −1.0, 0.2; the padding entry (9.0) is ignored.
    logp = f64([[0.5, -1.0], [0.2, 9.0]])
    mask = f64([[1, 1], [1, 0]])
    behavior = torch.zeros_like(logp)
    lam = [0.5, -1.0, 0.2]
    k3 = sum(math.exp(x) - x - 1 for x in lam) / 3
    assert mismatch_k3(logp, behavior, mask).item() == pytest.approx(k3, rel=1e-12)
    assert mismatch_drift(logp, behavior, mask).item() == pytest.approx(1.7 / 3, rel=1e-12)
    # A token μ rated near-impossible: λ = 100 counts as the clamp's 20, in fp32 too (exp(100) is inf there).
    extreme = torch.tensor([[0.0, -1.0]]), torch.tensor([[-100.0, -1.0]]), torch.ones(1, 2)
    k3_extreme = (math.exp(20) - 20 - 1) / 2
    assert mismatch_k3(*extreme).item() == pytest.approx(k3_extreme, rel=1e-6)
    torch.testing.assert_close(
        sequence_log_weights(logp, behavior, mask), f64([-0.5, 0.2]), rtol=0, atol=1e-15
    )


def test_sequence_ess_by_hand_and_at_its_bounds():
    w = [1.0, 2.0, 3.0]
    ess = sequence_ess(f64([math.log(x) for x in w])).item()
    assert ess == pytest.approx(sum(w) ** 2 / (3 * sum(x * x for x in w)), rel=1e-12)  # 36/42
    assert sequence_ess(f64([0.0, -1000.0, -1000.0, -1000.0])).item() == pytest.approx(1 / 4, rel=1e-12)
    assert sequence_ess(f64([5000.0, 0.0, 0.0])).item() == pytest.approx(1 / 3, rel=1e-12)  # no overflow
    assert sequence_ess(f64([700.0] * 5)).item() == pytest.approx(1.0, rel=1e-12)


def test_ref_log_ratio_by_hand():
    logp = f64([[-1.0, -2.0], [-0.5, -7.0]])
    ref = f64([[-1.5, -1.0], [-0.25, 0.0]])
    mask = f64([[1, 1], [1, 0]])
    # s − s_ref: (−3 − −2.5) = −0.5 and (−0.5 − −0.25) = −0.25
    assert ref_log_ratio(logp, ref, mask).item() == pytest.approx(-0.375, rel=1e-12)


def test_token_entropy_from_logits_by_hand():
    logits = f64([[[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, -math.inf]]])  # [B=1, T=2, V=4]
    p = [math.exp(x) / (math.e + math.e**2 + math.e**3) for x in (1.0, 2.0, 3.0)]
    expected = f64([[math.log(4), -sum(x * math.log(x) for x in p)]])
    torch.testing.assert_close(token_entropy(logits), expected, rtol=1e-12, atol=0)
    entropy_mean = token_entropy_mean(token_entropy(logits), f64([[1, 0]]))
    assert entropy_mean.item() == pytest.approx(math.log(4), rel=1e-12)


def test_q_ess_median_by_hand():
    q = f64([0.25, 0.25, 0.25, 0.25, 1, 0, 0, 0, 0.5, 0.5, 0, 0])  # per-group ESS 4, 1, 2
    assert q_ess_median(q, group_size=4).item() == pytest.approx(2.0, rel=1e-12)
    assert q_ess_median(q[:8], group_size=4).item() == pytest.approx(2.5, rel=1e-12)  # even G: middle mean


def test_success_ess_by_hand():
    q = f64([0.3, 0.1, 0.4, 0.2, 0.7, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 0.4])
    rewards = f64([1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0])
    # group 0: k = 2, q̃ = (0.75, 0.25) → 1/(2 · 0.625) = 0.8; group 1: k = 1, skipped;
    # group 2: k = 3, equal q̃ → 1
    assert success_ess(q, rewards, group_size=4).item() == pytest.approx(0.9, rel=1e-12)
    assert success_ess(q[4:8], rewards[4:8], group_size=4) is None


def test_micro_batch_accumulation_equals_the_full_batch():
    logp, behavior, mask = random_batch(B=9, seed=3)
    ref = logp + 0.1
    entropy = torch.rand(9, 5, dtype=torch.float64)
    tokens, responses = mask.sum(), mask.shape[0]
    parts = [slice(0, 2), slice(2, 7), slice(7, 9)]

    def summed(fn, *tensors, **count):
        return sum(fn(*(x[rows] for x in tensors), **count) for rows in parts)

    torch.testing.assert_close(
        summed(mismatch_k3, logp, behavior, mask, token_count=tokens),
        mismatch_k3(logp, behavior, mask),
        rtol=1e-12,
        atol=1e-15,
    )
    torch.testing.assert_close(
        summed(mismatch_drift, logp, behavior, mask, token_count=tokens),
        mismatch_drift(logp, behavior, mask),
        rtol=1e-12,
        atol=1e-15,
    )
    torch.testing.assert_close(
        summed(token_entropy_mean, entropy, mask, token_count=tokens),
        token_entropy_mean(entropy, mask),
        rtol=1e-12,
        atol=1e-15,
    )
    torch.testing.assert_close(
        summed(ref_log_ratio, logp, ref, mask, response_count=responses),
        ref_log_ratio(logp, ref, mask),
        rtol=1e-12,
        atol=1e-15,
    )
    log_w = torch.cat([sequence_log_weights(logp[rows], behavior[rows], mask[rows]) for rows in parts])
    torch.testing.assert_close(
        sequence_ess(log_w), sequence_ess(sequence_log_weights(logp, behavior, mask)), rtol=1e-12, atol=0
    )


def test_diagnostics_are_detached():
    logp, behavior, mask = random_batch()
    logp.requires_grad_()
    assert not mismatch_k3(logp, behavior, mask).requires_grad
    assert not sequence_log_weights(logp, behavior, mask).requires_grad
