"""The learners against hand transcriptions of SPEC.md, their gradients, micro-batching and paper Figure 6."""

import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ggpo_offline.train.learners import CORRECTIONS, LEARNERS, learner
from ggpo_offline.train.losses import (
    Derived,
    GroupMean,
    GroupWeights,
    Max,
    agro_loss,
    composed,
    ggpo_bounded_push_loss,
    ggpo_loss,
    grpo_loss,
    grpo_tis_loss,
)

TOL = dict(rtol=1e-9, atol=1e-12)
BETA = 0.1
HYPER = {
    "ggpo": {"beta": BETA},
    "ggpo-clip": {"beta": BETA},
    "agro": {"beta": BETA},
    "grpo": {},
    "grpo-tis": {},
    "proximal-kl": {"beta": 0.5, "horizon": 2, "cost_bound": 0.25},
    "pg": {"beta": 0.0},
    "cispo": {"cispo_low": 0.8, "cispo_high": 1.28},
    "seq-is": {"beta": 0.5, "horizon": 2, "cost_bound": 0.25},
    "is-free": {"beta": 0.5, "horizon": None, "cost_bound": 0.25},
    "ggpo-reward-only": {"beta": 0.5},
    "ggpo-bounded-push": {"beta": BETA, "push_bound": 4.2},  # cuts some of make_batch's responses, not all
    "rft": {},
    # Every framework preset: its parts, fixed by the registry.
    **{entry.name: dict(entry.fixed) for entry in CORRECTIONS},
}


def make_batch(G: int = 3, m: int = 4, T: int = 6, seed: int = 0) -> dict:
    """Random float64 minibatch with padding, mixed groups, and spikes that trigger every clip.

    token 0: behavior 3 nats below old (TIS cap, GRPO PPO/dual clip); token 1: learner 3 nats above old
    (GRPO+TIS PPO/dual clip); token 2: reference 4 nats above the learner (KL clamp)."""
    gen = torch.Generator().manual_seed(seed)
    B = G * m

    def noise(scale):
        return scale * torch.randn(B, T, generator=gen, dtype=torch.float64)

    logp = -3 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    old = logp + noise(0.1)
    old[:, 1] = logp[:, 1] - 3.0
    behavior = old + noise(0.3)
    behavior[:, 0] = old[:, 0] - 3.0
    ref = logp + noise(0.2)
    ref[:, 2] = logp[:, 2] + 4.0
    lengths = torch.randint(3, T + 1, (B,), generator=gen)
    mask = (torch.arange(T) < lengths[:, None]).to(torch.float64)
    rewards = (torch.rand(B, generator=gen) < 0.5).to(torch.float64)
    rewards[::m], rewards[1::m] = 1.0, 0.0  # every group mixed
    return {
        "logp": logp.requires_grad_(),
        "old_logp": old,
        "behavior_logp": behavior,
        "ref_logp": ref,
        "mask": mask,
        "rewards": rewards,
        "m": m,
    }


def call(name: str, batch: dict, rows: slice = slice(None), **kwargs):
    """Run the learner's loss on rows of the batch, passing only the inputs its record needs."""
    inputs = {key: batch[key][rows] for key in LEARNERS[name].needs}
    return LEARNERS[name].loss(
        batch["logp"][rows],
        mask=batch["mask"][rows],
        rewards=batch["rewards"][rows],
        **inputs,
        group_size=batch["m"],
        **HYPER[name],
        **kwargs,
    )


def grad_of(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


# --- hand transcriptions: plain Python loops over groups, responses and tokens ---------------------


def as_lists(batch: dict) -> dict:
    return {key: value.tolist() if torch.is_tensor(value) else value for key, value in batch.items()}


def seq_sum(x: list, mask: list, b: int) -> float:
    return sum(mask[b][t] * x[b][t] for t in range(len(x[b])))


def log_mean_exp(values: list, beta: float) -> float:
    top = max(values)
    return top + beta * math.log(sum(math.exp((v - top) / beta) for v in values) / len(values))


def softmax(values: list, beta: float) -> list:
    top = max(values)
    weights = [math.exp((v - top) / beta) for v in values]
    return [w / sum(weights) for w in weights]


def hand_ggpo(b: dict, beta: float):
    """L_GGPO = Σ_g J_g / (G β ℓ̄ sqrt(m−1)) with ℓ̄ = T_tok/(G m); returns (loss, J_g list, c_i list)."""
    B, m = len(b["rewards"]), b["m"]
    G, T_tok = B // m, sum(map(sum, b["mask"]))
    ell = T_tok / (G * m)
    J, c = [], []
    for g in range(G):
        R = []
        for i in range(g * m, g * m + m):
            s, s_ref = seq_sum(b["logp"], b["mask"], i), seq_sum(b["ref_logp"], b["mask"], i)
            R.append(b["rewards"][i] - beta * (s - s_ref))
        J.append(log_mean_exp(R, beta) - sum(R) / m)
        c += [(m * q - 1) / math.sqrt(m - 1) for q in softmax(R, beta)]
    return sum(J) / (G * beta * ell * math.sqrt(m - 1)), J, c


def hand_ggpo_clip(b: dict, beta: float, clip: float):
    """L_clip = −(1/T_tok) Σ c̄_i s_i, R̄_i = r_i − β Σ_t M clip(d_t, ±clip); returns (loss, stat_g, c̄_i)."""
    B, m = len(b["rewards"]), b["m"]
    T_tok = sum(map(sum, b["mask"]))
    loss, stat, c = 0.0, [], []
    for g in range(B // m):
        R_bar = []
        for i in range(g * m, g * m + m):
            clipped = [
                min(max(lp - rp, -clip), clip) for lp, rp in zip(b["logp"][i], b["ref_logp"][i], strict=True)
            ]
            R_bar.append(
                b["rewards"][i] - beta * sum(M * d for M, d in zip(b["mask"][i], clipped, strict=True))
            )
        stat.append(log_mean_exp(R_bar, beta) - sum(R_bar) / m)
        for i, q in zip(range(g * m, g * m + m), softmax(R_bar, beta), strict=True):
            c.append((m * q - 1) / math.sqrt(m - 1))
            loss -= c[-1] * seq_sum(b["logp"], b["mask"], i) / T_tok
    return loss, stat, c


def hand_agro(b: dict, beta: float):
    """L_AGRO = −(1/T_tok) Σ a_i s_i, a_i = m/(m−1) (z_i − mean z); returns (loss, a_i)."""
    B, m = len(b["rewards"]), b["m"]
    T_tok = sum(map(sum, b["mask"]))
    loss, a = 0.0, []
    for g in range(B // m):
        s = [seq_sum(b["logp"], b["mask"], i) for i in range(g * m, g * m + m)]
        s_ref = [seq_sum(b["ref_logp"], b["mask"], i) for i in range(g * m, g * m + m)]
        z = [b["rewards"][g * m + i] - beta * (s[i] - s_ref[i]) for i in range(m)]
        for i in range(m):
            a.append(m / (m - 1) * (z[i] - sum(z) / m))
            loss -= a[-1] * s[i] / T_tok
    return loss, a


def hand_grpo(b: dict, tis: bool, eps=0.2, dual=10.0, kl_coef=0.01, cap=2.0):
    """GRPO (tis=False) or GRPO+TIS loss and its gradient w.r.t. each token log-prob, token by token."""
    B, m, T = len(b["rewards"]), b["m"], len(b["logp"][0])
    T_tok = sum(map(sum, b["mask"]))
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for g in range(B // m):
        r = b["rewards"][g * m : g * m + m]
        mean = sum(r) / m
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (m - 1))
        for i in range(g * m, g * m + m):
            A = (b["rewards"][i] - mean) / (std + 1e-6)
            for t in range(T):
                if not b["mask"][i][t]:
                    continue
                lp, old, mu, ref = (b[k][i][t] for k in ("logp", "old_logp", "behavior_logp", "ref_logp"))
                rho, w = (
                    (math.exp(lp - old), min(math.exp(old - mu), cap)) if tis else (math.exp(lp - mu), 1.0)
                )
                pg1, pg2 = -A * rho, -A * min(max(rho, 1 - eps), 1 + eps)
                pg, dpg = (pg1, -A * rho) if pg1 >= pg2 else (pg2, 0.0)  # the clipped branch is constant
                if A < 0 and -A * dual < pg:
                    pg, dpg = -A * dual, 0.0
                k3 = math.exp(ref - lp) - (ref - lp) - 1
                kl, dkl = (k3, 1 - math.exp(ref - lp)) if -10 <= k3 <= 10 else (min(max(k3, -10), 10), 0.0)
                loss += (w * pg + kl_coef * kl) / T_tok
                grad[i][t] = (w * dpg + kl_coef * dkl) / T_tok
    return loss, torch.tensor(grad, dtype=torch.float64)


def response_coefficients(grad: torch.Tensor, mask: torch.Tensor, T_tok: float) -> torch.Tensor:
    """c_i from a gradient of the form −(1/T_tok) c_i M_t (checked): [B, T] -> [B]."""
    c = -T_tok * grad[:, 0]
    torch.testing.assert_close(grad, -c[:, None] * mask / T_tok, **TOL)
    return c


# --- each loss against its transcription -----------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_ggpo_matches_spec_and_gradient_is_eq9(seed):
    batch = make_batch(seed=seed)
    out = call("ggpo", batch)
    loss, J, c = hand_ggpo(as_lists(batch), BETA)
    assert out.loss.item() == pytest.approx(loss, rel=1e-10)
    torch.testing.assert_close(out.stats["group_loss"].value, torch.tensor(J, dtype=torch.float64), **TOL)
    c_hand = torch.tensor(c, dtype=torch.float64)
    c_auto = response_coefficients(
        grad_of(out.loss, batch["logp"]), batch["mask"], batch["mask"].sum().item()
    )
    torch.testing.assert_close(c_auto, c_hand, **TOL)  # ∂L/∂logp_t = −(1/T_tok) c_i M_t, c from q = softmax
    m = batch["m"]
    torch.testing.assert_close(out.stats["q"].value, (c_hand * math.sqrt(m - 1) + 1) / m, **TOL)


def test_ggpo_clip_matches_spec():
    batch = make_batch(seed=3)
    out = call("ggpo-clip", batch)
    loss, stat, c = hand_ggpo_clip(as_lists(batch), BETA, clip=0.05)
    assert out.loss.item() == pytest.approx(loss, rel=1e-10)
    torch.testing.assert_close(out.stats["group_loss"].value, torch.tensor(stat, dtype=torch.float64), **TOL)
    c_auto = response_coefficients(
        grad_of(out.loss, batch["logp"]), batch["mask"], batch["mask"].sum().item()
    )
    torch.testing.assert_close(c_auto, torch.tensor(c, dtype=torch.float64), **TOL)
    # The clip is active here, so the coefficients differ from unclipped GGPO's.
    _, _, c_unclipped = hand_ggpo(as_lists(batch), BETA)
    assert max(abs(x - y) for x, y in zip(c, c_unclipped, strict=True)) > 1e-3


def test_ggpo_clip_without_clipping_has_the_ggpo_gradient():
    batch = make_batch(seed=4)
    unclipped = grad_of(call("ggpo-clip", batch, clip=float("inf")).loss, batch["logp"])
    torch.testing.assert_close(unclipped, grad_of(call("ggpo", batch).loss, batch["logp"]), **TOL)


def test_ggpo_bounded_push_drops_only_negative_coefficients_of_responses_b_nats_below_the_reference():
    """c̃_i = c_i · 1[c_i ≥ 0 or s_i − s_i^ref > −B] (docs/learners.md), by hand from GGPO's c_i; the batch
    has pushes dropped and kept on both sides of B, so a bound read off s_i alone, a cut of positive
    coefficients or the full GGPO push all fail here."""
    batch, bound = make_batch(seed=9), HYPER["ggpo-bounded-push"]["push_bound"]
    lists = as_lists(batch)
    _, J, c = hand_ggpo(lists, BETA)
    log_ratio = [
        seq_sum(lists["logp"], lists["mask"], i) - seq_sum(lists["ref_logp"], lists["mask"], i)
        for i in range(len(c))
    ]
    cut = [c_i < 0 and lr <= -bound for c_i, lr in zip(c, log_ratio, strict=True)]
    kept_negative = [c_i < 0 and lr > -bound for c_i, lr in zip(c, log_ratio, strict=True)]
    assert sum(cut) >= 2 and sum(kept_negative) >= 2
    out = call("ggpo-bounded-push", batch)
    c_auto = response_coefficients(
        grad_of(out.loss, batch["logp"]), batch["mask"], batch["mask"].sum().item()
    )
    expected = [0.0 if dropped else c_i for c_i, dropped in zip(c, cut, strict=True)]
    torch.testing.assert_close(c_auto, torch.tensor(expected, dtype=torch.float64), **TOL)
    torch.testing.assert_close(out.stats["group_loss"].value, torch.tensor(J, dtype=torch.float64), **TOL)
    m = batch["m"]
    shares = [sum(cut[g * m : g * m + m]) / m for g in range(len(c) // m)]
    torch.testing.assert_close(out.stats["push_cut"].value, torch.tensor(shares, dtype=torch.float64), **TOL)


def test_ggpo_bounded_push_without_a_bound_has_the_ggpo_gradient():
    batch = make_batch(seed=4)
    inputs = (batch["logp"], batch["ref_logp"], batch["mask"], batch["rewards"])
    out = ggpo_bounded_push_loss(*inputs, group_size=batch["m"], beta=BETA, push_bound=float("inf"))
    unbounded = grad_of(out.loss, batch["logp"])
    torch.testing.assert_close(unbounded, grad_of(call("ggpo", batch).loss, batch["logp"]), **TOL)


def test_agro_matches_spec():
    batch = make_batch(seed=5)
    out = call("agro", batch)
    loss, a = hand_agro(as_lists(batch), BETA)
    assert out.loss.item() == pytest.approx(loss, rel=1e-10)
    torch.testing.assert_close(out.stats["advantage"], torch.tensor(a, dtype=torch.float64), **TOL)
    c_auto = response_coefficients(
        grad_of(out.loss, batch["logp"]), batch["mask"], batch["mask"].sum().item()
    )
    torch.testing.assert_close(c_auto, torch.tensor(a, dtype=torch.float64), **TOL)


@pytest.mark.parametrize("name", ["grpo", "grpo-tis"])
def test_grpo_matches_spec_token_by_token(name):
    batch = make_batch(seed=6)
    out = call(name, batch)
    loss, grad = hand_grpo(as_lists(batch), tis=name == "grpo-tis")
    assert out.loss.item() == pytest.approx(loss, rel=1e-10)
    torch.testing.assert_close(grad_of(out.loss, batch["logp"]), grad, **TOL)
    # The example exercises the PPO clip, the dual clip and the KL clamp.
    assert out.stats["clip_frac"] > 0 and out.stats["dual_clip_frac"] > 0 and out.stats["kl"] > 0


# --- micro-batching --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_micro_batches_with_global_token_count_sum_to_the_full_batch(name):
    batch = make_batch(G=4, m=4, seed=7)
    preset = LEARNERS[name].correction_preset
    if preset is not None and preset.correction.second_moment is not None:
        pytest.skip("AReaL's M2 mask is read over each call's tokens, as AReaL reads it per micro-batch")
    m, counts = batch["m"], {"token_count": int(batch["mask"].sum())}
    if preset is not None:  # a framework preset's own counts, as the trainer takes them before the step
        keys = ("mask", "old_logp", "behavior_logp", "logp")
        calls = [{key: batch[key].detach() for key in keys}]
        counts |= composed.minibatch_counts(preset.correction, calls, lambda x: x)
    full = call(name, batch)
    full_grad = grad_of(full.loss, batch["logp"])
    parts = [call(name, batch, slice(a * m, b * m), **counts) for a, b in [(0, 1), (1, 3), (3, 4)]]
    for part in parts:
        part.loss.backward()  # accumulates into logp.grad, as a trainer does
    torch.testing.assert_close(batch["logp"].grad, full_grad, **TOL)
    # A minibatch whose rejections keep no token has verl's NaN loss (0/0), in every part.
    torch.testing.assert_close(sum(part.loss for part in parts), full.loss, **TOL, equal_nan=True)
    for key, value in full.stats.items():  # each stat reduced as its kind declares gives the full-batch one
        if isinstance(value, Derived):  # computed from reduced stats of the same result
            assert set(value.inputs) <= set(full.stats)
            continue
        reduced = reduce_micro_batches([part.stats[key] for part in parts])
        value = value.value if isinstance(value, Max | GroupMean | GroupWeights) else value
        torch.testing.assert_close(reduced, value, **TOL)
        assert not value.requires_grad


def reduce_micro_batches(pieces: list) -> torch.Tensor:
    """One stat's micro-batch values combined as its kind says: scalars sum, `Max` takes the maximum,
    per-group and per-response values concatenate."""
    if isinstance(pieces[0], Max):
        return torch.stack([piece.value for piece in pieces]).amax()
    if isinstance(pieces[0], GroupMean | GroupWeights):
        return torch.cat([piece.value for piece in pieces])
    return torch.cat(pieces) if pieces[0].dim() > 0 else sum(pieces)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_bool_mask_gives_the_float_mask_result(name):
    batch = make_batch(seed=8)
    full = call(name, batch)
    as_bool = call(name, {**batch, "mask": batch["mask"].bool()})
    torch.testing.assert_close(as_bool.loss, full.loss, **TOL, equal_nan=True)  # NaN: nothing kept (verl)
    torch.testing.assert_close(grad_of(as_bool.loss, batch["logp"]), grad_of(full.loss, batch["logp"]), **TOL)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_each_registry_record_matches_its_loss_signature_and_the_config(name):
    """A renamed keyword or input fails here instead of silently falling back to the loss's default."""
    from dataclasses import fields

    from ggpo_offline.train.config import TrainConfig

    record = LEARNERS[name]
    parameters = inspect.signature(record.loss).parameters
    keywords = {p for p, v in parameters.items() if v.kind is v.KEYWORD_ONLY} - {"group_size", "token_count"}
    chosen = set(record.hyperparameters) | set(record.fixed)
    assert chosen == keywords if not record.fixed else chosen <= keywords  # PG fixes β = 0, so H is moot
    assert set(record.hyperparameters) <= {f.name for f in fields(TrainConfig)}
    inputs = {p for p in parameters if p.endswith("_logp") and p != "logp"}
    required = {p for p in inputs if parameters[p].default is inspect.Parameter.empty}
    assert required <= set(record.needs) <= inputs
    assert record.refreshes_reference == (TrainConfig(method=name).ref_refresh is not None)


def test_registry_lookup_and_group_validation():
    assert learner("grpo-tis").needs == ("old_logp", "behavior_logp", "ref_logp")
    with pytest.raises(ValueError, match="unknown method 'ppo'; choose from ggpo, ggpo-clip"):
        learner("ppo")
    batch = make_batch(G=2, m=4)
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        ggpo_loss(batch["logp"], batch["ref_logp"], batch["mask"], batch["rewards"], group_size=3, beta=BETA)
    with pytest.raises(ValueError, match="at least 2"):
        agro_loss(batch["logp"], batch["ref_logp"], batch["mask"], batch["rewards"], group_size=1, beta=BETA)


# --- GGPO group loss bounds ------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(0, 1), st.floats(-3, 3)), min_size=2, max_size=8),
    beta=st.floats(0.01, 2.0),
)
def test_ggpo_group_loss_lies_between_its_bounds(data, beta):
    rewards = torch.tensor([r for r, _ in data], dtype=torch.float64)
    log_ratio = torch.tensor([[d] for _, d in data], dtype=torch.float64)  # one token per response
    m = len(data)
    out = ggpo_loss(
        log_ratio, torch.zeros_like(log_ratio), torch.ones_like(log_ratio), rewards, group_size=m, beta=beta
    )
    R = rewards - beta * log_ratio[:, 0]
    J, gap = out.stats["group_loss"].value.item(), (R.max() - R.mean()).item()
    assert J >= -1e-12  # ≥ 0 up to rounding
    assert gap - beta * math.log(m) - 1e-12 <= J <= gap + 1e-12


@settings(max_examples=50, deadline=None)
@given(level=st.floats(-1, 2), log_ratio=st.lists(st.floats(-3, 3), min_size=2, max_size=8))
def test_ggpo_group_loss_is_zero_for_equal_adjusted_rewards(level, log_ratio):
    d = torch.tensor(log_ratio, dtype=torch.float64)[:, None]
    rewards = level + BETA * d[:, 0]  # R_i = r_i − β d_i = level for every i
    out = ggpo_loss(d, torch.zeros_like(d), torch.ones_like(d), rewards, group_size=len(log_ratio), beta=BETA)
    assert abs(out.stats["group_loss"].value.item()) < 1e-12


# --- paper Figure 6: summed coefficient on the correct responses, m = 8, k = 1..7 correct ----------


def figure6_batch(equal_log_ratios: bool, m: int = 8, T: int = 5) -> dict:
    """Group k−1 has k correct responses; learner-to-reference log ratios equal per group, or random."""
    gen = torch.Generator().manual_seed(11)
    B = (m - 1) * m
    logp = -2 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    mask = (torch.arange(T) < torch.randint(1, T + 1, (B,), generator=gen)[:, None]).to(torch.float64)
    if equal_log_ratios:  # s_i − s_i^ref = D_g for every response of group g
        D = torch.randn(m - 1, generator=gen, dtype=torch.float64).repeat_interleave(m)
        ref = logp - mask * (D / mask.sum(1))[:, None]
    else:
        ref = logp + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    rewards = torch.tensor([float(i < k) for k in range(1, m) for i in range(m)], dtype=torch.float64)
    return {
        "logp": logp.requires_grad_(),
        "ref_logp": ref,
        "behavior_logp": logp.detach(),
        "mask": mask,
        "rewards": rewards,
        "m": m,
    }


def correct_coefficient_sums(out, batch) -> list[float]:
    """W_k = Σ_{i: r_i = 1} c_i per group, c_i read from autograd."""
    c = response_coefficients(grad_of(out.loss, batch["logp"]), batch["mask"], batch["mask"].sum().item())
    return (c * batch["rewards"]).reshape(-1, batch["m"]).sum(1).tolist()


def test_figure6_grpo_is_proportional_to_sqrt_k_times_m_minus_k():
    batch = figure6_batch(
        equal_log_ratios=True
    )  # ratio 1 (behavior = learner), KL gradient 0 (ref = learner)
    batch["ref_logp"] = batch["logp"].detach()
    out = grpo_loss(
        batch["logp"],
        batch["behavior_logp"],
        batch["ref_logp"],
        batch["mask"],
        batch["rewards"],
        group_size=8,
    )
    assert out.stats["clip_frac"] == 0 and out.stats["kl"] == 0
    m = 8
    for k, W in enumerate(correct_coefficient_sums(out, batch), start=1):
        std = math.sqrt(k * (m - k) / (m * (m - 1)))
        # Σ_correct A_i = k (1 − k/m) / (std + 1e-6) = sqrt(k(m−k)) · sqrt((m−1)/m) · std/(std + 1e-6)
        assert W == pytest.approx(
            math.sqrt(k * (m - k)) * math.sqrt((m - 1) / m) * std / (std + 1e-6), rel=1e-10
        )


def test_figure6_agro_is_k_times_m_minus_k_over_m_minus_1():
    batch = figure6_batch(equal_log_ratios=True)
    out = agro_loss(
        batch["logp"], batch["ref_logp"], batch["mask"], batch["rewards"], group_size=8, beta=BETA
    )
    for k, W in enumerate(correct_coefficient_sums(out, batch), start=1):
        assert W == pytest.approx(k * (8 - k) / 7, rel=1e-10)


@pytest.mark.parametrize("equal_log_ratios", [True, False])
def test_figure6_ggpo_tends_to_m_minus_k_over_sqrt_m_minus_1(equal_log_ratios):
    batch = figure6_batch(equal_log_ratios)
    out = ggpo_loss(
        batch["logp"], batch["ref_logp"], batch["mask"], batch["rewards"], group_size=8, beta=1e-3
    )
    # At β = 1e-3 the incorrect responses' weight is O(exp(−1/β)): the limit holds to float64 precision.
    for k, W in enumerate(correct_coefficient_sums(out, batch), start=1):
        assert W == pytest.approx((8 - k) / math.sqrt(7), abs=1e-9)


# --- GRPO clip bounds, KL clamp, TIS cap on hand-built tokens --------------------------------------

# One group of m = 2, rewards (1, 0): A = ±0.5 / (std + 1e-6) with std = sqrt(1/2).
A_POS = 0.5 / (math.sqrt(0.5) + 1e-6)


def two_response_batch(log_rho_pos: list, log_rho_neg: list) -> tuple:
    """logp = 0, behavior_logp = −log ρ per token; response 0 has A > 0, response 1 has A < 0."""
    logp = torch.zeros(2, len(log_rho_pos), dtype=torch.float64, requires_grad=True)
    behavior = -torch.tensor([log_rho_pos, log_rho_neg], dtype=torch.float64)
    return logp, behavior, torch.ones_like(behavior), torch.tensor([1.0, 0.0], dtype=torch.float64)


def test_grpo_ppo_clip_and_dual_clip_by_hand():
    rho_pos = [1.5, 0.9, 0.5]  # A > 0: clipped above 1.2; unclipped; unclipped (no lower bound for A > 0)
    rho_neg = [20.0, 3.0, 0.5]  # A < 0: dual clip at 10; unclipped; clipped below at 0.8
    logp, behavior, mask, rewards = two_response_batch(
        list(map(math.log, rho_pos)), list(map(math.log, rho_neg))
    )
    out = grpo_loss(logp, behavior, logp.detach(), mask, rewards, group_size=2, kl_coef=0.0)
    A = A_POS
    pg = [[-A * 1.2, -A * 0.9, -A * 0.5], [A * 10.0, A * 3.0, A * 0.8]]
    assert out.loss.item() == pytest.approx(sum(map(sum, pg)) / 6, rel=1e-12)
    expected_grad = torch.tensor([[0.0, -A * 0.9, -A * 0.5], [0.0, A * 3.0, 0.0]], dtype=torch.float64) / 6
    torch.testing.assert_close(grad_of(out.loss, logp), expected_grad, **TOL)
    assert (
        out.stats["clip_frac"].item() == pytest.approx(2 / 6) and out.stats["dual_clip_frac"].item() == 1 / 6
    )


def test_grpo_kl_is_k3_clamped_at_10():
    log_ratio = [0.5, 4.0, -20.0]  # log π_ref − log π_θ: k3 = 0.149, 49.6 → 10, 19 → 10
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([log_ratio, log_ratio], dtype=torch.float64)
    rewards = torch.ones(2, dtype=torch.float64)  # A = 0: only the KL term is left
    out = grpo_loss(logp, logp.detach(), ref, torch.ones_like(ref), rewards, group_size=2, kl_coef=0.01)
    k3 = math.exp(0.5) - 0.5 - 1
    assert out.stats["kl"].item() == pytest.approx((k3 + 10 + 10) / 3, rel=1e-12)
    assert out.loss.item() == pytest.approx(0.01 * (k3 + 10 + 10) / 3, rel=1e-12)
    row = [0.01 * (1 - math.exp(0.5)) / 6, 0.0, 0.0]  # d k3 / d logp = 1 − exp(ref − logp); 0 where clamped
    torch.testing.assert_close(grad_of(out.loss, logp), torch.tensor([row, row], dtype=torch.float64), **TOL)


def test_grpo_tis_weight_is_capped_at_2():
    logp = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)  # ρ = 1: no PPO clip
    behavior = -torch.tensor([[math.log(3.0), math.log(1.5)]] * 2, dtype=torch.float64)  # w = min(3, 2), 1.5
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    out = grpo_tis_loss(logp, old, behavior, logp.detach(), torch.ones_like(old), rewards, group_size=2)
    A = A_POS
    assert out.loss.item() == pytest.approx((-A * 2 - A * 1.5 + A * 2 + A * 1.5) / 4, abs=1e-15)
    expected_grad = torch.tensor([[-2 * A, -1.5 * A], [2 * A, 1.5 * A]], dtype=torch.float64) / 4
    torch.testing.assert_close(grad_of(out.loss, logp), expected_grad, **TOL)
    assert out.stats["tis_weight_mean"].item() == pytest.approx(1.75) and out.stats["tis_clip_frac"] == 0.5


@pytest.mark.parametrize("name", ["grpo", "grpo-tis"])
def test_extreme_log_probs_keep_the_fp32_gradient_finite_and_exact(name):
    """A token μ rated near-impossible (log μ = −100) and one the learner does (log π_θ = −100, so the k3
    ratio π_ref/π_θ is e^100): exp overflows fp32 unless the log-ratio is clamped; clamped, the loss and
    gradient still equal the unclamped float64 transcription."""
    batch = make_batch(seed=9)
    with torch.no_grad():
        batch["behavior_logp"][0, 0] = -100.0
        batch["logp"][1, 0], batch["ref_logp"][1, 0] = -100.0, 0.0
    fp32 = {k: v.detach().float() if torch.is_tensor(v) else v for k, v in batch.items()}
    fp32["logp"].requires_grad_()
    out = call(name, fp32)
    grad = grad_of(out.loss, fp32["logp"])
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    loss, expected = hand_grpo(as_lists(batch), tis=name == "grpo-tis")
    assert out.loss.item() == pytest.approx(loss, rel=1e-5)
    torch.testing.assert_close(grad, expected.float(), rtol=1e-4, atol=1e-7)
