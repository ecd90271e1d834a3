"""Every framework preset equals its framework's code: the frameworks' own numbers
(tests/framework_numbers.json: verl, AReaL, TRL, OpenRLHF, prime-rl and ROLL run on three float64 inputs,
padding, partial and total rejection and a band edge among them) to 1e-10, SPEC-corrections §g's
normalisers, and the precision each framework computes in; one realistic bug per fix breaks them."""

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_corrections import MUTATIONS as FAMILY_MUTATIONS
from test_corrections import mismatches

from ggpo_offline.train.correction_presets import CORRECTION_PRESETS, Correction
from ggpo_offline.train.losses import behavior, composed
from ggpo_offline.train.losses.aggregation import aggregate

F64 = torch.float64
NUMBERS = json.loads((Path(__file__).with_name("framework_numbers.json")).read_text())
PRESET = {preset.name: preset.correction for preset in CORRECTION_PRESETS}
TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-8
"""For a framework that reads its weight in float32 (AReaL): torch's float32 exp is within an ulp of exact,
not the same ulp on every processor (with AVX-512 two of the padded input's weights are an ulp off the
correctly rounded ones, and six losses differ from the fixture machine's by 2-4e-9); a float64 weight, the
realistic bug, breaks eight entries."""


def _correction(entry: dict) -> Correction:
    override = dict(entry["override"])
    if "rejections" in override:
        override["rejections"] = tuple(
            (option, tuple(value) if isinstance(value, list) else value)
            for option, value in override["rejections"]
        )
    return replace(PRESET[entry["preset"]] if entry["preset"] else Correction(), **override)


def _loss(correction: Correction, case: str, **counts) -> tuple[float, torch.Tensor]:
    """(loss, ∂loss/∂log π_θ) of ``correction`` on one of the fixture's inputs, in one call."""
    x = {key: torch.tensor(value, dtype=F64) for key, value in NUMBERS["inputs"][case].items()}
    logp = x["logp"].clone().requires_grad_()
    out = composed.correction_loss(
        logp, x["old"], x["logmu"], x["mask"], x["advantages"], x["rewards"], correction, **counts
    )
    out.loss.backward()
    return out.loss.item(), logp.grad


def _number(value) -> float:
    return math.nan if value == "nan" else float(value)


def differing() -> list[str]:
    """The fixture's entries this toolkit does not reproduce to 1e-10, or `FLOAT32_TOLERANCE` (loss, or any
    gradient entry; a NaN loss must be NaN here too)."""
    wrong = []
    for entry in NUMBERS["entries"]:
        correction = _correction(entry)
        tolerance = FLOAT32_TOLERANCE if correction.float32_ratio else TOLERANCE
        loss, grad = _loss(correction, entry["input"])
        theirs = _number(entry["loss"])
        expected = torch.tensor([[_number(v) for v in row] for row in entry["grad"]], dtype=F64)
        both_nan = math.isnan(loss) and math.isnan(theirs)
        same_loss = both_nan or abs(loss - theirs) <= tolerance
        if not (same_loss and torch.allclose(grad, expected, rtol=0, atol=tolerance)):
            wrong.append(f"{entry['framework']} {entry['config']} on {entry['input']}")
    return wrong


def test_every_framework_number_is_reproduced():
    assert differing() == []


def test_every_preset_is_some_framework_configuration_exactly():
    claimed = {entry["preset"] for entry in NUMBERS["entries"] if not entry["override"]}
    assert claimed == set(PRESET)
    frameworks = {entry["framework"] for entry in NUMBERS["entries"]}
    assert frameworks == {"verl", "AReaL", "TRL", "OpenRLHF", "prime-rl", "ROLL"}


def _example(correction: Correction, **counts) -> tuple[float, torch.Tensor]:
    return _loss(correction, "small", **counts)


def test_verl_divides_by_the_tokens_its_rejection_keeps_in_both_modes():
    """SPEC-corrections §g on its example input: one response of two kept, so N_kept = 3 of N = 6."""
    band = (("seq_mean_k1", (0.8, 1.5)),)
    decoupled = replace(PRESET["verl-decoupled-geo-rs-seq-tis"], rejections=band)
    assert _example(decoupled)[0] == pytest.approx(0.587358, abs=1e-6)
    assert _example(replace(PRESET["verl-bypass-ppo-clip-geo-rs"], rejections=band))[0] == pytest.approx(
        1.533333, abs=1e-6
    )
    assert _example(replace(PRESET["verl-bypass-pg-geo-rs-seq-tis"], rejections=band))[0] == pytest.approx(
        -0.707725, abs=1e-6
    )
    # Keeping N instead (the count_kept field off) halves the loss: the step is not verl's.
    assert _example(replace(decoupled, count_kept=False))[0] == pytest.approx(0.587358 / 2, abs=1e-6)


def test_verl_keeping_no_token_gives_nan_with_a_zero_gradient_in_both_modes():
    """bypass_ppo_clip_k3_rs(0.3) rejects every token of the example (§g), and so does decoupled_k3_rs(0.01)
    (its sequence-mean k3 are .2049 and .5587, §a): 0/0, as verl's token-mean, and nothing learned."""
    for correction in (
        replace(PRESET["verl-bypass-ppo-clip-k3-rs"], rejections=(("seq_mean_k3", 0.3),)),
        PRESET["verl-decoupled-k3-rs"],
    ):
        loss, grad = _example(correction)
        assert math.isnan(loss) and torch.equal(grad, torch.zeros_like(grad))
    x = {key: torch.tensor(value, dtype=F64) for key, value in NUMBERS["inputs"]["small"].items()}
    inputs = (x["logp"], x["old"], x["logmu"], x["mask"], x["advantages"], x["rewards"])
    out = composed.correction_loss(*inputs, PRESET["verl-decoupled-k3-rs"])
    assert out.stats["correction/none_kept"].value == 1.0 and out.stats["correction/masked_frac"] == 1.0


def test_areal_m2po_divides_by_the_tokens_its_m2_mask_keeps():
    """§g: τ = 0.04 keeps 1 of 6 tokens, loss −1.051271 (over all six it would be −0.175212)."""
    assert _example(PRESET["areal-m2po"])[0] == pytest.approx(-1.051271, abs=1e-6)
    assert _example(replace(PRESET["areal-m2po"], count_kept=False))[0] == pytest.approx(-0.175212, abs=1e-6)


def test_verls_k1_band_is_read_in_float64():
    """A sequence-mean k1 2e-8 past log 1.001 is outside verl's band (math.log); float32 bounds, 4.7e-8
    wider than log 1.001, would keep it."""
    k1 = torch.tensor([[math.log(1.001) + 2e-8], [math.log(1.0005)]], dtype=F64)
    mask = torch.ones(2, 1, dtype=F64)
    keep = behavior.rejection_keep(-k1, mask, "seq_mean_k1", (0.999, 1.001))
    assert keep[:, 0].tolist() == [0.0, 1.0]
    assert float(torch.log(torch.tensor(1.001))) - math.log(1.001) > 4e-8


def test_the_frameworks_epsilons():
    """By hand from SPEC-corrections §f's example (lengths 6, 3, 5, 2; token means .35, .8, 1.5, 1.95) with
    a fifth, empty response: verl's sequence mean is Σ_i mean_i·L_i/(L_i + 1e-8) over the 4 responses with a
    token; TRL's is Σ_i mean_i over all 5 responses."""
    lengths = [6, 3, 5, 2, 0]
    mask = torch.tensor([[t < n for t in range(6)] for n in lengths], dtype=F64)
    loss = torch.tensor([[(6 * i + t + 1) / 10 for t in range(6)] for i in range(5)], dtype=F64)
    means = [0.35, 0.8, 1.5, 1.95]
    verl = sum(m * n / (n + 1e-8) for m, n in zip(means, lengths, strict=False)) / 4
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(verl, abs=1e-15)
    assert aggregate(loss, mask, "seq-mean-token-mean", sequence_mean="trl").item() == pytest.approx(
        sum(means) / 5, abs=1e-15
    )
    assert abs(verl - sum(means) / 4) > 1e-9  # the epsilon is visible at this precision
    # verl's batch-normalised sequence weight is each response's token mean over L + 1e-8 tokens.
    weight = torch.full((1, 3), 2.0, dtype=F64)
    assert behavior.weight_total(weight, torch.ones(1, 3, dtype=F64), "sequence").item() == pytest.approx(
        6 / (3 + 1e-8), abs=1e-15
    )


def test_trl_sapos_negative_temperature_is_float32():
    """TRL chooses τ with torch.where of two Python floats, a float32 tensor: τ_neg = 1.0499999523."""
    assert PRESET["trl-sapo"].tau_neg == float(torch.tensor(1.05, dtype=torch.float32))
    assert PRESET["verl-sapo"].tau_neg == 1.05


def test_areal_reads_its_behaviour_weight_in_float32():
    """The example's e^λ of response 2's last token, λ = 1.2, from float32 log-probs (AReaL upcasts to
    float32 whatever the input): it differs from the float64 weight by more than 1e-9."""
    case = {key: torch.tensor(value, dtype=F64) for key, value in NUMBERS["inputs"]["small"].items()}
    x, weight_x = composed._log_ratio(PRESET["areal-behave-clamp"], case["logp"], case["old"], case["logmu"])
    assert weight_x.dtype == torch.float32 and x.dtype == F64
    assert weight_x[1, 2].item() == (case["old"][1, 2].float() - case["logmu"][1, 2].float()).item()
    assert abs(weight_x[1, 2].exp().item() - math.exp(1.2)) > 1e-9


def test_a_correction_refuses_an_unknown_sequence_mean():
    with pytest.raises(ValueError, match="sequence_mean is one of verl, trl, got 'roll'"):
        Correction(sequence_mean="roll")


# The realistic bug of each fix beside each family's (test_corrections.py); each must break a number.
FIX_MUTATIONS = {
    "the normaliser counts the rejected tokens (N for N_kept)": (
        composed, "aggregate",
        lambda real: lambda loss, mask, mode, **k: real(loss, torch.ones_like(mask), mode, **k)),
    "the k1 band's bounds in float32": (
        behavior, "math", lambda real: SimpleNamespace(log=lambda v: float(torch.log(torch.tensor(v))))),
    "AReaL's weight from a float64 log-ratio": (
        composed, "_log_ratio", lambda real: lambda c, *a: (real(c, *a)[0],) * 2),
    "TRL's sequence mean taken as verl's": (
        composed, "aggregate", lambda real: lambda *a, **k: real(*a, **{**k, "sequence_mean": "verl"})),
    "verl's batch-normalised sequence weight over L, not L + 1e-8": (
        behavior, "weight_total",
        lambda real: lambda w, mask, level: real(w, mask, level) if level == "token" else (
            (mask * w).sum(-1) / mask.sum(-1).clamp(min=1))[mask.sum(-1) > 0].sum()),
}  # fmt: skip


MUTATIONS = {**FAMILY_MUTATIONS, **FIX_MUTATIONS}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=MUTATIONS)
def test_each_realistic_bug_breaks_a_worked_or_a_framework_number(monkeypatch, mutation):
    module, name, wrap = MUTATIONS[mutation]
    monkeypatch.setattr(module, name, wrap(getattr(module, name)))
    assert mismatches() != [] or differing() != []
