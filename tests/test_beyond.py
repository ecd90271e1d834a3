"""SPEC-beyond.md's analytic test cases (fp64): Proximal KL and PG, CISPO, sequence-level IS, IS-free,
GGPO reward-only weights, and the RFT control. Micro-batching (PK-4) is tested for every learner in
test_losses."""

import itertools
import math

import pytest
import torch

from ggpo_offline.train.losses import (
    cispo_loss,
    ggpo_loss,
    ggpo_reward_only_loss,
    is_free_loss,
    proximal_kl_loss,
    rft_loss,
    seq_is_loss,
)

EXACT = dict(rtol=0, atol=1e-10)
INF = float("inf")


def batch(seed: int = 0, G: int = 2, m: int = 4, T: int = 5) -> dict:
    """Random fp64 groups with padding and mixed rewards; logp is a leaf with grad."""
    gen = torch.Generator().manual_seed(seed)
    B = G * m
    logp = (-3 * torch.rand(B, T, generator=gen, dtype=torch.float64)).requires_grad_()
    behavior = logp.detach() + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref = logp.detach() + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    lengths = torch.randint(2, T + 1, (B,), generator=gen)
    mask = (torch.arange(T) < lengths[:, None]).to(torch.float64)
    rewards = (torch.rand(B, generator=gen) < 0.5).to(torch.float64)
    rewards[::m], rewards[1::m] = 1.0, 0.0
    return {"logp": logp, "behavior": behavior, "ref": ref, "mask": mask, "rewards": rewards, "m": m}


def grad(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, logp)
    return g


def advantage(b: dict) -> torch.Tensor:
    r = b["rewards"].reshape(-1, b["m"])
    return (r - r.mean(dim=1, keepdim=True)).flatten()


def pkl(b: dict, **kw):
    return proximal_kl_loss(
        b["logp"], b["behavior"], b["mask"], b["rewards"], b["ref"], group_size=b["m"], **kw
    )


# --- Proximal KL and PG (§1) --------------------------------------------------------------------------


def test_pk1_zero_beta_or_window_is_pg_and_on_policy_pg_is_reinforce():
    b = batch()
    T_tok, w, A = b["mask"].sum(), (b["logp"].detach() - b["behavior"]).exp(), advantage(b)
    pg = -b["mask"] * w * A[:, None] / T_tok
    for kw in ({"beta": 0.0}, {"beta": 0.3, "horizon": 0}):
        torch.testing.assert_close(grad(pkl(b, **kw).loss, b["logp"]), pg, **EXACT)
    for horizon, bound in ((None, INF), (2, 0.01)):
        on_ref = {**b, "ref": b["logp"].detach()}  # C ≡ 0 for every β, H, ε_F
        torch.testing.assert_close(
            grad(pkl(on_ref, beta=0.7, horizon=horizon, cost_bound=bound).loss, b["logp"]), pg, **EXACT
        )
    on_policy = {**b, "ref": b["logp"].detach(), "behavior": b["logp"].detach()}
    reinforce = -b["mask"] * A[:, None] / T_tok
    torch.testing.assert_close(grad(pkl(on_policy, beta=0.7).loss, b["logp"]), reinforce, **EXACT)


def one_response(cost: list[float], mask: list[float]) -> dict:
    """A group of two identical responses, rewards (1, 0), behavior = learner (w = 1), ℓ = cost."""
    logp = torch.zeros(2, len(cost), dtype=torch.float64, requires_grad=True)
    ref = -torch.tensor([cost, cost], dtype=torch.float64)
    m = torch.tensor([mask, mask], dtype=torch.float64)
    return {
        "logp": logp,
        "behavior": logp.detach(),
        "ref": ref,
        "mask": m,
        "rewards": torch.tensor([1.0, 0.0]).double(),
        "m": 2,
    }


@pytest.mark.parametrize(
    ("horizon", "bound", "mask", "credit"),
    [
        (2, 0.25, [1, 1, 1, 1], [-0.10, 0.05, 0.30, 0.05]),
        (2, 0.25, [1, 1, 1, 0], [-0.10, 0.05, 0.25, 0.0]),
        (None, INF, [1, 1, 1, 1], [0.25, 0.15, 0.35, 0.05]),
        (1, INF, [1, 1, 1, 1], [0.1, -0.2, 0.3, 0.05]),
    ],
)
def test_pk2_window_credit(horizon, bound, mask, credit):
    b = one_response([0.1, -0.2, 0.3, 0.05], mask)
    g = grad(pkl(b, beta=1.0, horizon=horizon, cost_bound=bound).loss, b["logp"])
    A = torch.tensor([0.5, -0.5], dtype=torch.float64)
    C = torch.tensor([credit, credit], dtype=torch.float64)
    expected = -b["mask"] * (A[:, None] - C) / b["mask"].sum()
    torch.testing.assert_close(g, expected, **EXACT)


# --- PK-3: exact enumeration on a tabular tree (vocabulary 2, length 2, 3 histories) --------------------

TAUS = list(itertools.product([0, 1], repeat=2))
REWARD = torch.tensor([1.0 if a == b else 0.0 for a, b in TAUS], dtype=torch.float64)  # r = 1 on 00, 11


def token_logps(logits: torch.Tensor) -> torch.Tensor:
    """log π(a_t | history) of every trajectory's two tokens: [4, 2]."""
    logsm = torch.log_softmax(logits, dim=-1)
    return torch.stack([torch.stack([logsm[0, a], logsm[1 + a, b]]) for a, b in TAUS])


def expected_update(theta, ref_logits, sample_logits, behavior_logits, loss_fn) -> torch.Tensor:
    """Σ_τ P_sample(τ) Σ_t κ_t ∇_θ log π_θ(a_t), with κ_t = −T_tok ∂L/∂logp_t read off the learner's loss."""
    logp = token_logps(theta)
    leaf = logp.detach().requires_grad_()
    inputs = {
        "logp": leaf, "mask": torch.ones(4, 2, dtype=torch.float64), "rewards": REWARD,
        "ref_logp": token_logps(ref_logits).detach(), "behavior_logp": token_logps(behavior_logits).detach(),
    }  # fmt: skip
    kappa = -8 * grad(loss_fn(inputs).loss, leaf)  # T_tok = 8
    p_sample = token_logps(sample_logits).sum(dim=1).exp().detach()
    (update,) = torch.autograd.grad((p_sample[:, None] * kappa * logp).sum(), theta)
    return update


def pk3_setup():
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    ref, mu = torch.randn(3, 2, generator=gen, dtype=torch.float64), torch.randn(3, 2, generator=gen).double()
    return theta, ref, mu


def as_group(loss_fn, **kw):
    """The four trajectories as one group of m = 4: Â = r − mean r, a constant baseline (allowed in PK-3)."""
    return lambda inputs: loss_fn(**inputs, group_size=4, **kw)


def test_pk3a_on_policy_full_window_is_the_gradient_of_the_kl_regularized_objective():
    theta, ref, _ = pk3_setup()
    beta = 0.7
    traj = token_logps(theta).sum(dim=1)
    objective = (traj.exp() * (REWARD - beta * (traj - token_logps(ref).sum(dim=1)))).sum()
    (exact,) = torch.autograd.grad(objective, theta)
    full = expected_update(theta, ref, theta, theta, as_group(proximal_kl_loss, beta=beta, cost_bound=INF))
    assert (full - exact).abs().max() < 1e-12
    local = expected_update(
        theta, ref, theta, theta, as_group(proximal_kl_loss, beta=beta, horizon=1, cost_bound=INF)
    )
    assert (local - exact).abs().max() > 1e-3


def test_pk3b_token_weighted_update_vanishes_at_the_gibbs_target_off_policy():
    _, ref, mu = pk3_setup()
    beta = 0.7
    target = token_logps(ref).sum(dim=1).exp() * (REWARD / beta).exp()
    target = target / target.sum()  # π* ∝ π_ref e^{r/β}, then its per-history conditionals
    root = torch.stack([target[0] + target[1], target[2] + target[3]])
    theta = torch.log(torch.stack([root, target[:2] / root[0], target[2:] / root[1]])).requires_grad_()
    kw = {"beta": beta, "cost_bound": INF}
    token = expected_update(theta, ref, mu, mu, as_group(proximal_kl_loss, **kw))
    assert token.abs().max() < 1e-12
    free = expected_update(
        theta,
        ref,
        mu,
        mu,
        lambda x: is_free_loss(**{k: v for k, v in x.items() if k != "behavior_logp"}, group_size=4, **kw),
    )
    seq = expected_update(theta, ref, mu, mu, as_group(seq_is_loss, **kw))
    assert free.abs().max() > 1e-2 and seq.abs().max() > 1e-2


# --- CISPO (§2) -----------------------------------------------------------------------------------------


def test_ci1_unbounded_cispo_is_pg():
    b = batch(seed=1)
    cispo = cispo_loss(
        b["logp"], b["behavior"], b["mask"], b["rewards"], group_size=4, cispo_low=0, cispo_high=INF
    )
    pg = pkl(b, beta=0.0)
    torch.testing.assert_close(cispo.loss, pg.loss, **EXACT)
    torch.testing.assert_close(grad(cispo.loss, b["logp"]), grad(pg.loss, b["logp"]), **EXACT)


def test_ci2_bounds_clip_the_weight_and_keep_every_gradient():
    weights = torch.tensor([0.4, 1.14, 1.56, 9.0], dtype=torch.float64)
    logp = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    behavior = -torch.stack([weights.log(), weights.log()])
    mask, rewards = torch.ones(2, 4, dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64)
    out = cispo_loss(logp, behavior, mask, rewards, group_size=2, cispo_low=0.8, cispo_high=1.28)
    clipped = torch.tensor([0.8, 1.14, 1.28, 1.28], dtype=torch.float64)
    A = torch.tensor([0.5, -0.5], dtype=torch.float64)
    torch.testing.assert_close(grad(out.loss, logp), -clipped * A[:, None] / 8, **EXACT)
    assert out.stats["cispo/clip_frac_low"].item() == pytest.approx(1 / 4)
    assert out.stats["cispo/clip_frac_high"].item() == pytest.approx(2 / 4)


def test_ci3_unit_bounds_ignore_the_behavior_policy():
    b = batch(seed=2)
    out = cispo_loss(
        b["logp"], b["behavior"], b["mask"], b["rewards"], group_size=4, cispo_low=1, cispo_high=1
    )
    torch.testing.assert_close(
        grad(out.loss, b["logp"]), -b["mask"] * advantage(b)[:, None] / b["mask"].sum(), **EXACT
    )


# --- sequence-level IS (§3) and IS-free (§4) -------------------------------------------------------------

KW = {"beta": 0.6, "horizon": 2, "cost_bound": 0.1}


def seq(b):
    return seq_is_loss(b["logp"], b["behavior"], b["ref"], b["mask"], b["rewards"], group_size=b["m"], **KW)


def free(b):
    return is_free_loss(b["logp"], b["ref"], b["mask"], b["rewards"], group_size=b["m"], **KW)


def test_sq1_if2_on_policy_seq_is_and_is_free_equal_proximal_kl():
    b = {**batch(seed=3)}
    b["behavior"] = b["logp"].detach()
    expected = grad(pkl(b, **KW).loss, b["logp"])
    for out in (seq(b), free(b)):
        torch.testing.assert_close(grad(out.loss, b["logp"]), expected, **EXACT)


def test_sq2_constant_token_weights_make_seq_is_proximal_kl():
    b = batch(seed=4)
    shift = torch.linspace(-0.3, 0.4, b["logp"].shape[0], dtype=torch.float64)[:, None]
    b["behavior"] = b["logp"].detach() - shift  # λ constant over each response
    torch.testing.assert_close(grad(seq(b).loss, b["logp"]), grad(pkl(b, **KW).loss, b["logp"]), **EXACT)


def test_sq3_the_geometric_mean_ignores_padding():
    lam = torch.tensor([[0.2, -0.4, 0.5, 7.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    logp = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    out = seq_is_loss(logp, -lam, logp.detach(), mask, rewards, group_size=2, beta=0.0, cost_bound=0.1)
    assert out.stats["is/w_max"].value.item() == pytest.approx(math.exp(0.1), rel=1e-12)


def test_if1_is_free_without_kl_is_the_group_mean_baseline_score():
    b = batch(seed=5)
    out = is_free_loss(b["logp"], b["ref"], b["mask"], b["rewards"], group_size=b["m"], beta=0.0)
    A, T_tok = advantage(b), b["mask"].sum()
    torch.testing.assert_close(grad(out.loss, b["logp"]), -b["mask"] * A[:, None] / T_tok, **EXACT)
    s = (b["mask"] * b["logp"]).sum(dim=1)
    torch.testing.assert_close(out.loss, -(A * s).sum() / T_tok, **EXACT)


# --- GGPO reward-only (§5) and RFT ------------------------------------------------------------------------


def coefficients(rewards: list[float], beta: float) -> torch.Tensor:
    """c̃ = −T_tok ∂L/∂s_i from a loss on one-token responses."""
    m = len(rewards)
    logp = torch.zeros(m, 1, dtype=torch.float64, requires_grad=True)
    out = ggpo_reward_only_loss(
        logp, torch.ones(m, 1).double(), torch.tensor(rewards).double(), group_size=m, beta=beta
    )
    return -m * grad(out.loss, logp)[:, 0]


@pytest.mark.parametrize(
    ("beta", "correct", "wrong"), [(0.01, 0.6299408, -0.3779645), (0.5, 0.4444402, -0.2666641)]
)
def test_gr1_reward_only_coefficients(beta, correct, wrong):
    c = coefficients([1.0] * 3 + [0.0] * 5, beta)
    assert c[:3].tolist() == pytest.approx([correct] * 3, abs=1e-7)
    assert c[3:].tolist() == pytest.approx([wrong] * 5, abs=1e-7)
    assert c.sum().item() == pytest.approx(0.0, abs=1e-12)
    if beta == 0.01:
        assert c[:3].sum().item() == pytest.approx(5 / math.sqrt(7), abs=1e-7)


def test_gr2_gr3_equals_ggpo_at_the_reference_and_ignores_constant_groups():
    b = batch(seed=6)
    only = ggpo_reward_only_loss(b["logp"], b["mask"], b["rewards"], group_size=b["m"], beta=0.3)
    full = ggpo_loss(b["logp"], b["logp"].detach(), b["mask"], b["rewards"], group_size=b["m"], beta=0.3)
    torch.testing.assert_close(grad(only.loss, b["logp"]), grad(full.loss, b["logp"]), **EXACT)
    assert coefficients([1.0] * 4, 0.01).abs().max().item() == 0.0


def test_rft_is_the_nll_of_the_correct_responses():
    b = batch(seed=7)
    out = rft_loss(b["logp"], b["mask"], b["rewards"], group_size=b["m"])
    correct = b["rewards"][:, None]
    T_tok = b["mask"].sum()
    torch.testing.assert_close(out.loss, -(correct * b["mask"] * b["logp"]).sum() / T_tok, **EXACT)
    torch.testing.assert_close(grad(out.loss, b["logp"]), -correct * b["mask"] / T_tok, **EXACT)
