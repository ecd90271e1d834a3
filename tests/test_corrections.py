"""The frameworks' rollout corrections equal SPEC-corrections.md's worked numbers (float64, loss and
∂loss/∂log π_θ), part by part and preset by preset; a micro-batched minibatch gives the whole one's loss
and gradient; and the realistic bugs of each family (the ratio against the wrong policy, a mask inverted,
product for geometric mean) each break a worked number."""

import math
import re

import pytest
import torch

from ggpo_offline.core.errors import UserError
from ggpo_offline.train.correction_presets import CORRECTION_PRESETS, Correction
from ggpo_offline.train.learners import CORRECTIONS, LEARNERS, learner
from ggpo_offline.train.losses import aggregation, behavior, composed, objectives
from ggpo_offline.train.losses.aggregation import aggregate
from ggpo_offline.train.training_presets import resolve_config

F64 = torch.float64
MU = torch.tensor([[0.5, 0.2, 0.6], [0.7, 0.4, 0.1]], dtype=F64)
LAM = torch.tensor([[0.1, 0.9, 0.3], [-0.8, -0.9, 1.2]], dtype=F64)  # log π_old − log μ
RHO = torch.tensor([[0.05, 0.3, -0.25], [-0.3, 0.1, 0.0]], dtype=F64)  # log π_θ − log π_old
A = torch.tensor([1.0, -1.0], dtype=F64)
REWARDS = torch.tensor([1.0, 0.0], dtype=F64)
MASK = torch.ones(2, 3, dtype=F64)
PRESET = {preset.name: preset.correction for preset in CORRECTION_PRESETS}
# verl's batch normalisation divides the truncated weights by their mean (SPEC-corrections §a), and every loss
# below is linear in w: the normalised presets' worked losses are the plain ones over these means.
TOKEN_IS_MEAN = float(LAM.exp().clamp(max=2).mean())  # the SPEC's [[1.1052, 2, 1.3499], [.4493, .4066, 2]]
SEQ_IS_MEAN = float(LAM.sum(dim=1).exp().clamp(max=2).mean())  # the SPEC's [2 | .6065]


def example(correction: Correction) -> tuple[float, torch.Tensor]:
    """SPEC-corrections.md's example input through ``correction``: (loss, ∂loss/∂log π_θ)."""
    behavior_logp = MU.log()
    old_logp = behavior_logp + LAM
    logp = (old_logp + RHO).requires_grad_()
    out = composed.correction_loss(logp, old_logp, behavior_logp, MASK, A, REWARDS, correction)
    out.loss.backward()
    return out.loss.item(), logp.grad


# (correction, loss, gradient or None where the SPEC gives none): SPEC-corrections.md §a–e.
WORKED = {
    "verl-decoupled-token-is": (PRESET["verl-decoupled-token-is"], -0.300719,
                                [[-0.1936, 0, -0.1752], [0, 0.0749, 0.3333]]),
    "verl-decoupled-seq-is": (PRESET["verl-decoupled-seq-is"], -0.716345, None),
    "verl-decoupled-token-is-norm": (PRESET["verl-decoupled-token-is-norm"], -0.300719 / TOKEN_IS_MEAN,
                                     [[-0.1936 / TOKEN_IS_MEAN, 0, -0.1752 / TOKEN_IS_MEAN],
                                      [0, 0.0749 / TOKEN_IS_MEAN, 0.3333 / TOKEN_IS_MEAN]]),
    "verl-decoupled-seq-is-norm": (PRESET["verl-decoupled-seq-is-norm"], -0.716345 / SEQ_IS_MEAN, None),
    "verl-bypass-ppo-clip": (PRESET["verl-bypass-ppo-clip"], 0.197816, None),
    "verl-bypass-pg-is": (PRESET["verl-bypass-pg-is"], 0.117274, [[-1 / 3] * 3, [0.0828] * 3]),
    "trl-sequence-mask (dapo)": (PRESET["trl-sequence-mask"], 0.293679, [[0, 0, 0], [0, 0.1117, 0.1011]]),
    "trl without IS": (Correction(), -0.020817, None),
    "trl-cispo": (PRESET["trl-cispo"], -0.086442, None),
    "trl-cispo-docs": (PRESET["trl-cispo-docs"], -0.412290, None),
    "trl-sequence-mask-opsm": (PRESET["trl-sequence-mask-opsm"], 0.0, [[0, 0, 0], [0, 0, 0]]),
    "trl-gspo": (PRESET["trl-gspo"], 0.283707, None),
    "openrlhf-tis": (PRESET["openrlhf-tis"], -0.148654, None),
    "openrlhf-icepop": (PRESET["openrlhf-icepop"], -0.307419, None),
    "openrlhf-seq-mask-tis": (PRESET["openrlhf-seq-mask-tis"], -0.172620,
                              [[-0.1936, 0, -0.1752], [0, 0.0749, 0.5534]]),
    "openrlhf-gspo-is": (PRESET["openrlhf-gspo-is"], -0.2, [[0, 0, 0], [0, 0, 0]]),
    "prime-rl": (PRESET["prime-rl"], 0.185294, [[-0.1936, 0.0004, -0.1752], [-0.0004, -0.0003, 0.5538]]),
    "verl-gspo": (PRESET["verl-gspo"], -0.049194, [[-0.1723] * 3, [0.1559] * 3]),
    "verl-sapo": (PRESET["verl-sapo"], -0.102589, None),
    "roll-topr": (PRESET["roll-topr"], -0.414099, None),
    "roll-kimi15": (PRESET["roll-kimi15"], -0.474898,
                    [[(-a + 0.1 * r) / 6 for r in RHO[i].tolist()] for i, a in enumerate(A.tolist())]),
}  # fmt: skip


def mismatches() -> list[str]:
    """The worked examples whose loss (to 1e-6) or gradient (to 1e-4) the code does not reproduce."""
    wrong = []
    for name, (correction, loss, gradient) in WORKED.items():
        value, grad = example(correction)
        if not math.isclose(value, loss, abs_tol=1e-6) or (
            gradient is not None and not torch.allclose(grad, torch.tensor(gradient, dtype=F64), atol=1e-4)
        ):
            wrong.append(name)
    return wrong


def test_every_worked_loss_and_gradient_is_reproduced():
    assert mismatches() == []


def test_the_importance_weights_of_each_framework():
    token, sequence = (behavior.log_weight(LAM, MASK, level).exp() for level in ("token", "sequence"))
    q = [[1.1052, 2.4596, 1.3499], [0.4493, 0.4066, 3.3201]]
    assert torch.allclose(token, torch.tensor(q, dtype=F64), atol=1e-4)
    assert torch.allclose(sequence[:, 0], torch.tensor([3.6693, 0.6065], dtype=F64), atol=1e-4)
    geometric = behavior.log_weight(LAM, MASK, "geometric").exp()[:, 0]
    assert torch.allclose(geometric, torch.tensor([1.5424, 0.8465], dtype=F64), atol=1e-4)
    # verl token TIS (C = 2); TRL token_truncate, token_mask, sequence_truncate, sequence_mask (max 3).
    assert torch.allclose(
        behavior.truncate(token, None, 2.0),
        torch.tensor([[1.1052, 2, 1.3499], [0.4493, 0.4066, 2]], dtype=F64),
        atol=1e-4,
    )  # noqa: E501
    assert behavior.truncate(token, None, 3.0)[1, 2] == 3.0
    assert (token * behavior.inside(token, None, 3.0))[1].tolist()[2] == 0.0
    assert torch.allclose(
        behavior.truncate(sequence, None, 3.0)[:, 0], torch.tensor([3, 0.6065], dtype=F64), atol=1e-4
    )  # noqa: E501
    assert torch.allclose(
        (sequence * behavior.inside(sequence, None, 3.0))[:, 0],
        torch.tensor([0, 0.6065], dtype=F64),
        atol=1e-4,
    )  # noqa: E501


def test_verls_batch_normalised_weights():
    token = behavior.truncate(behavior.log_weight(LAM, MASK, "token").exp(), None, 2.0)
    sequence = behavior.truncate(behavior.log_weight(LAM, MASK, "sequence").exp(), None, 2.0)
    N, G = MASK.sum(), torch.tensor(2.0, dtype=F64)
    normalised = behavior.batch_normalize(token, behavior.weight_total(token, MASK, "token"), N, "token")
    spec = [[0.9070, 1.6414, 1.1078], [0.3688, 0.3337, 1.6414]]
    assert torch.allclose(normalised, torch.tensor(spec, dtype=F64), atol=1e-4)
    capped = torch.tensor([[2.0, 0.1, 0.1]], dtype=F64)  # a mean below 1 lifts the capped weight over C = 2
    ones = torch.ones_like(capped)
    assert behavior.batch_normalize(capped, capped.sum(), ones.sum(), "token").max() == pytest.approx(
        2 / 0.7333, abs=1e-3
    )
    total = behavior.weight_total(sequence, MASK, "sequence")
    normalised = behavior.batch_normalize(sequence, total, G, "sequence")
    assert torch.allclose(normalised[:, 0], torch.tensor([1.5346, 0.4654], dtype=F64), atol=1e-4)
    assert TOKEN_IS_MEAN == pytest.approx(7.3110 / 6, abs=1e-4) and SEQ_IS_MEAN == pytest.approx(
        1.30325, abs=1e-4
    )
    # A padded token counts in neither sum, a response without tokens in neither mean.
    padded = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=F64)
    assert behavior.weight_total(token, padded, "token") == pytest.approx(1.1052 + 2, abs=1e-4)
    assert behavior.weight_total(sequence, padded, "sequence") == pytest.approx(2.0)
    # A mean at or below 1e-8 leaves the weights as they are, as verl does.
    assert torch.equal(behavior.batch_normalize(token, torch.tensor(0.0, dtype=F64), N, "token"), token)


@pytest.mark.parametrize(
    "parts", [{"bypass": True}, {"weight": "geometric"}, {"truncate": False}, {"filter_level": "geometric"}]
)
def test_batch_normalisation_outside_verls_decoupled_truncated_weights_is_refused(parts):
    with pytest.raises(ValueError, match="batch_normalize is verl's"):
        Correction(**{"weight": "token", "weight_high": 2.0, "batch_normalize": True, **parts})


@pytest.mark.parametrize(
    ("option", "threshold", "keep"),
    [
        ("token_k1", (0.5, 2.0), [[1, 0, 1], [0, 0, 0]]),
        ("token_k1", (0.8, 1.5), [[1, 0, 0], [0, 0, 0]]),
        ("token_k3", 0.1, [[1, 0, 1], [0, 0, 0]]),
        ("seq_sum_k1", (0.5, 2.0), [[0, 0, 0], [1, 1, 1]]),
        ("seq_mean_k1", (0.8, 1.25), [[0, 0, 0], [1, 1, 1]]),
        ("seq_mean_k3", 0.1, [[0, 0, 0], [0, 0, 0]]),
        ("seq_max_k2", 0.5, [[1, 1, 1], [0, 0, 0]]),
    ],
)
def test_verls_rejection_masks(option, threshold, keep):
    assert behavior.rejection_keep(LAM, MASK, option, threshold).tolist() == keep


def test_the_m2po_mask_drops_the_largest_second_moments_until_the_rest_is_below_tau():
    assert behavior.second_moment_keep(LAM, MASK, 0.2).tolist() == [[1, 0, 1], [0, 0, 0]]
    assert behavior.second_moment_keep(LAM, MASK, 0.04).tolist() == [[1, 0, 0], [0, 0, 0]]
    assert behavior.second_moment_keep(LAM, MASK, 1e-9).sum() == 1  # at least one token is kept


def test_the_off_policy_sequence_mask_drops_only_a_drifted_negative_response():
    kappa = LAM + RHO
    assert behavior.off_policy_sequence_keep(kappa, MASK, A, 0.05)[:, 0].tolist() == [1, 0]
    assert behavior.off_policy_sequence_keep(kappa, MASK, A, 0.3)[:, 0].tolist() == [1, 1]


def test_prime_rls_masks_on_the_probability_gap():
    """Δp = π_θ − μ = [[.0809, .4640, .0308], [−.4670, −.2203, .2320]] (SPEC-corrections §d)."""
    logp = MU.log() + LAM + RHO
    default = objectives.probability_gap_keep(logp, MU.log(), A, 0.2, 0.2, both_sides=False)
    assert default.tolist() == [[1, 0, 1], [0, 0, 1]]
    ipo = objectives.probability_gap_keep(logp, MU.log(), A, 0.1, 0.1, both_sides=True)
    assert ipo.tolist() == [[1, 0, 1], [0, 0, 0]]


def test_the_aggregation_modes():
    lengths = [6, 3, 5, 2]
    mask = torch.tensor([[t < n for t in range(6)] for n in lengths], dtype=F64)
    loss = torch.tensor(
        [[(6 * i + t + 1) / 10 if t < n else 100.0 for t in range(6)] for i, n in enumerate(lengths)],
        dtype=F64,
    )  # noqa: E501
    expected = {"token-mean": 0.99375, "seq-mean-token-sum": 3.975, "seq-mean-token-mean": 1.15}
    for mode, value in expected.items():
        assert aggregate(loss, mask, mode).item() == pytest.approx(value, abs=1e-7), mode
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", scale=6).item() == pytest.approx(2.65)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", scale=512).item() == pytest.approx(
        0.0310547, abs=1e-7
    )
    assert set(aggregation.AGGREGATIONS) == {"token-mean", *expected, "seq-mean-token-sum-norm"}


def _group_batch(seed: int = 0, groups: int = 4, m: int = 4, T: int = 6):
    generator = torch.Generator().manual_seed(seed)
    B = groups * m
    # Every other response barely off-policy, so that each rejection keeps some responses and drops others.
    drift = torch.tensor([3e-4, 0.3], dtype=F64).repeat(B // 2)[:, None]
    logp = -torch.rand(B, T, generator=generator, dtype=F64) * 2
    behavior_logp = logp + drift * torch.randn(B, T, generator=generator, dtype=F64)
    old_logp = behavior_logp + drift * torch.randn(B, T, generator=generator, dtype=F64)
    lengths = torch.randint(1, T + 1, (B,), generator=generator)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    rewards = torch.randint(0, 2, (B,), generator=generator).to(F64)
    return logp, old_logp, behavior_logp, mask, rewards, m


@pytest.mark.parametrize(
    "preset", [p for p in CORRECTION_PRESETS if p.correction.second_moment is None], ids=lambda p: p.name
)
def test_micro_batches_on_group_boundaries_give_the_whole_minibatchs_loss_and_gradient(preset):
    """AReaL's M2 mask is read over each call's tokens, as AReaL reads it per micro-batch: not split here."""
    logp, old_logp, behavior_logp, mask, rewards, m = _group_batch()

    def loss(rows: slice, **counts) -> tuple[float, torch.Tensor]:
        x = logp.clone().requires_grad_()
        out = composed.corrected_loss(x[rows], behavior_logp[rows], mask[rows], rewards[rows], group_size=m,
                             correction=preset.correction, old_logp=old_logp[rows], **counts)  # fmt: skip
        out.loss.backward()
        return out.loss.item(), x.grad

    whole, whole_grad = loss(slice(None))
    # What the trainer counts over the minibatch's micro-batches (here its two halves) before the first loss.
    halves = [slice(0, 2 * m), slice(2 * m, None)]
    calls = [
        {"mask": mask[h], "old_logp": old_logp[h], "behavior_logp": behavior_logp[h], "logp": logp[h]}
        for h in halves
    ]
    counts = {"token_count": mask.sum(), **composed.minibatch_counts(preset.correction, calls, lambda x: x)}
    first, first_grad = loss(slice(0, 2 * m), **counts)
    second, second_grad = loss(slice(2 * m, None), **counts)
    assert first + second == pytest.approx(whole, abs=1e-12)
    assert torch.allclose(first_grad + second_grad, whole_grad, atol=1e-12)
    assert (whole_grad.abs().sum(dim=1) > 0).any()


# Each family's realistic bug, applied to a part; each must break a worked number
# (tests/test_framework_equality.py applies them).
MUTATIONS = {
    "the weight's ratio against π_θ, not π_old": (
        composed, "_behaviour",
        lambda real: lambda c, x, weight_x, kappa, mask, A: real(c, kappa, kappa, kappa, mask, A)),
    "the objective's ratio against μ, not π_old": (
        composed, "_objective",
        lambda real: lambda c, logp, rho, A, r, mask, mu, w: real(c, logp, logp - mu, A, r, mask, mu, w)),
    "a keep-mask inverted": (behavior, "inside", lambda real: lambda *a, **k: 1 - real(*a, **k)),
    "the geometric mean for the product": (
        behavior, "log_weight",
        lambda real: lambda x, mask, level: real(x, mask, "geometric" if level == "sequence" else level)),
    "the token weights' total taken per response": (
        behavior, "weight_total", lambda real: lambda weight, mask, level: real(weight, mask, "sequence")),
    "the PPO clip one-sided": (
        objectives, "ppo", lambda real: lambda rho, A, low, high, c: real(rho, A, 10.0, high, c)),
    "GSPO's ratio summed, not averaged, over tokens": (
        objectives, "sequence_log_ratio",
        lambda real: lambda rho, mask: real(rho * mask.sum(-1, keepdim=True), mask)),
}  # fmt: skip


def test_every_preset_is_a_learner_that_reads_only_pi_olds_schedule():
    assert [entry.name for entry in CORRECTIONS] == [preset.name for preset in CORRECTION_PRESETS]
    for entry in CORRECTIONS:
        assert LEARNERS[entry.name] is entry and entry.loss_name == "corrected_loss"
        bypass = entry.correction_preset.correction.bypass
        assert entry.needs == (("behavior_logp",) if bypass else ("old_logp", "behavior_logp"))
        assert entry.settings == (() if bypass else ("tis_block",))
    config = resolve_config("tiny", None, method="trl-sequence-mask", tis_block=1)
    assert config.tis_block == 1 and config.ref_refresh is None
    with pytest.raises(
        UserError, match="--clip-eps is not read by trl-sequence-mask; it is read by grpo, grpo-tis$"
    ):
        resolve_config(None, None, method="trl-sequence-mask", clip_eps=0.3)
    readers = r"it is read by grpo-tis, 34 framework presets \(docs/corrections.md\)$"
    with pytest.raises(UserError, match=f"--tis-block is not read by verl-bypass-ppo-clip; {readers}"):
        resolve_config(None, None, method="verl-bypass-ppo-clip", tis_block=3)
    with pytest.raises(UserError, match="did you mean 'trl-sequence-mask'"):
        learner("trl-sequence-masks")


def test_diagnostics_csv_has_the_correction_columns_only_when_a_run_logged_them(tmp_path):
    from types import SimpleNamespace

    from ggpo_offline.compare.report import CORRECTION_DIAGNOSTICS, DIAGNOSTICS, write_diagnostics
    from ggpo_offline.train.run_records import RunSettings

    plain = SimpleNamespace(
        method="grpo", seed=1, settings=RunSettings({}), metrics=[{"update": 0, "mismatch/k3": 0.5}]
    )
    masked = {"update": 0, **dict.fromkeys(CORRECTION_DIAGNOSTICS, 0.25)}
    preset = SimpleNamespace(method="trl-sequence-mask", seed=1, settings=RunSettings({}), metrics=[masked])
    path = tmp_path / "diagnostics.csv"
    write_diagnostics([plain], path)
    assert path.read_text().splitlines()[0] == ",".join(("method", "seed", "update", *DIAGNOSTICS))
    write_diagnostics([plain, preset], path)
    header, first, second = path.read_text().splitlines()
    assert header.endswith(",".join(CORRECTION_DIAGNOSTICS))
    assert first.endswith("," * len(CORRECTION_DIAGNOSTICS))
    assert second.endswith(",0.25" * len(CORRECTION_DIAGNOSTICS))


def test_the_knob_table_names_every_part_field_and_only_those():
    from dataclasses import fields

    from conftest import REPO

    doc = (REPO / "docs" / "corrections.md").read_text()
    table = doc.split("## Each framework knob")[1].split("\n## ")[0]
    named = {
        field
        for row in table.splitlines()
        if row.startswith("| ") and row.count("|") == 4
        for field in re.findall(r"`([a-z0-9_]+)`", row.split("|")[3])
    }
    values = {"ppo", "reinforce", "gspo"}  # objective values the table quotes beside its field
    assert named - values == {f.name for f in fields(Correction)}
