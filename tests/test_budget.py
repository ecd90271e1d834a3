"""compare/budget.py: a compare's seeds and evaluation sizes chosen within a budget, from a previous report's
validation variance and run times: exact costs and projections, the choice, the refusals, and a simulation
with training runs that differ showing that the projection to other sizes holds."""

import json
import math

import numpy as np
import pytest
from scipy import special
from test_stats import DIFFICULTY, INTERACTION_SD, PROBLEM_SD, _run_logit_sd

from ggpo_offline.compare import stats
from ggpo_offline.compare.budget import (
    Allocation,
    Costs,
    Evidence,
    allocations,
    budgeted,
    read_evidence,
)
from ggpo_offline.compare.config import CompareConfig
from ggpo_offline.compare.counts import COUNTS_FILE, Counts
from ggpo_offline.core.errors import UserError
from ggpo_offline.train.profile import PhaseTime
from ggpo_offline.train.run_folder import RunFolder

COSTS = Costs(train=50.0, per_response=0.02, run_evaluations=3.0, base_evaluations=2)


def test_a_compare_costs_its_runs_training_and_every_sampled_response():
    # 8 runs x 50 s + 128 x 4 responses x (8 runs x 3 evaluations + 2 base evaluations) x 0.02 s
    assert COSTS.seconds(8, 128, 4) == pytest.approx(8 * 50 + 128 * 4 * 26 * 0.02)
    assert COSTS.seconds(8, 128, 4) == pytest.approx(666.24)


def test_the_projected_difference_is_the_median_pairs_power_quantile_times_its_error():
    parts = (
        stats.Components(seed=40.0, problem=100.0, residual=600.0, sampling=500.0),
        stats.Components(seed=10.0, problem=100.0, residual=600.0, sampling=500.0),
        stats.Components(seed=90.0, problem=100.0, residual=600.0, sampling=500.0),
    )
    evidence = Evidence(parts, problems=128, samples=8, costs=COSTS, where="here")
    # The median pair (σ²_seed 40) at 5 seeds x 256 problems x 4 samples: sampling doubles (8 -> 4).
    variance = 40 / 5 + 100 / 256 + (100 + 500 * 2) / (5 * 256)
    quantile = float(stats.power_quantile(4))
    assert evidence.mde(5, 256, 4) == pytest.approx(quantile * math.sqrt(variance))
    assert quantile == pytest.approx(2.776445 + 0.940965, abs=1e-5)  # t_.975 + t_.8 on 4 df


def _evidence(seed: float, sampling: float, costs: Costs = COSTS) -> Evidence:
    parts = (stats.Components(seed=seed, problem=50.0, residual=sampling + 20.0, sampling=sampling),)
    return Evidence(parts, problems=128, samples=8, costs=costs, where="here")


def test_the_best_allocation_is_the_smallest_detectable_difference_the_budget_buys():
    budget = 3600.0
    found = allocations(_evidence(seed=30.0, sampling=800.0), methods=4, budget_s=budget)
    assert found == sorted(found, key=lambda a: (a.mde, a.seconds))
    assert all(a.seconds <= budget and a.seeds >= 2 for a in found)
    best = found[0]
    # Brute force over every seed count (not only the most that fit) finds nothing better.
    evidence = _evidence(seed=30.0, sampling=800.0)
    for problems in (32, 64, 128, 256, 512, 1024):
        for samples in (2, 4, 8, 16, 32):
            for seeds in range(2, 101):
                if COSTS.seconds(4 * seeds, problems, samples) <= budget:
                    assert evidence.mde(seeds, problems, samples) >= best.mde - 1e-12
    # Each choice takes the most seeds that fit: one more would not.
    for a in found:
        assert COSTS.seconds(4 * (a.seeds + 1), a.problems, a.samples) > budget


def test_runs_that_differ_buy_seeds_and_noisy_samples_buy_samples():
    expensive_training = Costs(train=500.0, per_response=0.001, run_evaluations=3.0, base_evaluations=2)
    runs_differ = allocations(_evidence(seed=200.0, sampling=100.0), 4, 3600.0)[0]
    samples_noisy = allocations(_evidence(seed=0.5, sampling=3000.0, costs=expensive_training), 4, 9000.0)[0]
    assert runs_differ.samples <= 2 and runs_differ.seeds > 5
    assert samples_noisy.problems * samples_noisy.samples >= 4096 and samples_noisy.seeds <= 4


def _write_report(folder, seeds=(1, 2), profiled=True) -> None:
    """A compare report folder: counts.json of 2 methods x ``seeds`` at updates 0, 10, 20 on validation and
    final/selected on test, with every run's profile.jsonl."""
    rng = np.random.default_rng(0)
    prompts = tuple(f"p{i}" for i in range(64))
    correct, selected = {}, {}
    for method in ("a", "b"):
        for seed in seeds:
            for update in (0, 10, 20):
                counts = rng.binomial(4, 0.5, 64) if update else np.full(64, 2)
                correct[(method, seed, "validation", update)] = {"arith-validation": tuple(map(int, counts))}
            selected[(method, seed)] = 10 if seed == seeds[0] else 20
            for update in {0, 20, selected[(method, seed)]}:
                counts = rng.binomial(4, 0.5, 64)
                correct[(method, seed, "test", update)] = {"arith-test": tuple(map(int, counts))}
            if profiled:
                (folder / "runs" / f"{method}-s{seed}").mkdir(parents=True)
                RunFolder(folder / "runs" / f"{method}-s{seed}").append_profile(
                    [
                        PhaseTime("process", None, 5.0),
                        PhaseTime("anchors", 0, 4.0),
                        PhaseTime("forward_backward", 0, 30.0),
                        PhaseTime("optimizer", 0, 1.0),
                        PhaseTime("evaluate", 0, 0.01),  # the base model's, from the compare's cache
                        PhaseTime("evaluate", 10, 6.0),
                        PhaseTime("evaluate", 20, 7.0),
                        PhaseTime("test", None, 20.0),
                    ]
                )
    Counts(
        methods=("a", "b"),
        seeds=tuple(seeds),
        n={"validation": 4, "test": 4},
        ks={"validation": (1, 4), "test": (1, 4)},
        prompts={"validation": {"arith-validation": prompts}, "test": {"arith-test": prompts}},
        correct=correct,
        selected=selected,
        drift={(m, s): () for m in ("a", "b") for s in seeds},
    ).write(folder / COUNTS_FILE)


def test_a_report_folder_gives_its_validation_components_and_its_runs_times(tmp_path):
    _write_report(tmp_path)
    evidence = read_evidence(tmp_path)
    assert (evidence.problems, evidence.samples) == (64, 4)
    # training: anchors + forward_backward + optimizer (process start-up is the compare's, not the run's)
    assert evidence.costs.train == pytest.approx(35.0)
    # 13 s of validation evaluations for 2 x 64 x 4 sampled responses, in every run
    assert evidence.costs.per_response == pytest.approx(13.0 / 512)
    # updates 10 and 20 on validation; test of the final checkpoint, and of update 10 in half of the runs
    assert evidence.costs.run_evaluations == pytest.approx(3.5)
    assert evidence.costs.base_evaluations == 2
    counts = Counts.read(tmp_path / COUNTS_FILE)
    a = np.array([counts.correct[("a", s, "validation", 20)]["arith-validation"] for s in (1, 2)])
    b = np.array([counts.correct[("b", s, "validation", 20)]["arith-validation"] for s in (1, 2)])
    assert evidence.parts == (stats.difference(a, b, 4).parts,)  # never the test split's


def test_a_budget_chooses_the_seeds_and_the_sizes_not_given(tmp_path):
    _write_report(tmp_path)
    config = CompareConfig(
        methods=("grpo", "ggpo"), seeds=(42, 1), budget=20.0, budget_from=tmp_path, settings={"eval_n": 4}
    )
    chosen, found = budgeted(config)
    best = found[0]
    assert all(a.samples == 4 for a in found)  # the user's --eval-n stays
    assert chosen.settings == {
        "eval_n": 4,
        "eval_num_problems": best.problems,
        "test_num_problems": best.problems,
    }
    assert chosen.seeds[:3] == (42, 1, 2)[: best.seeds] and len(chosen.seeds) == best.seeds
    assert (chosen.budget, chosen.budget_from) == (None, None)
    assert budgeted(chosen) == (chosen, [])
    assert isinstance(best, Allocation) and best.seconds <= 20 * 60


@pytest.mark.parametrize(
    ("settings", "write", "expected"),
    [
        ({"budget": 20.0}, None, "--budget needs --budget-from"),
        ({"budget_from": "."}, None, "--budget-from needs --budget"),
        ({"budget": -1.0, "budget_from": "."}, None, "--budget must be > 0"),
        ({"budget": 20.0, "budget_from": "."}, None, "has no counts.json"),
        ({"budget": 20.0, "budget_from": "."}, {"seeds": (1,)}, "needs at least 2 methods and 2 seeds"),
        ({"budget": 20.0, "budget_from": "."}, {"profiled": False}, "no run recorded its times"),
        ({"budget": 0.5, "budget_from": "."}, {}, "does not buy 2 seeds of 2 methods; the cheapest"),
    ],
)
def test_a_budget_that_cannot_be_planned_is_refused_in_one_line(tmp_path, settings, write, expected):
    if write is not None:
        _write_report(tmp_path, **write)
    if "budget_from" in settings:
        settings = {**settings, "budget_from": tmp_path}
    with pytest.raises(UserError, match=expected.replace("(", r"\(")) as refused:
        budgeted(CompareConfig(methods=("grpo", "ggpo"), **settings))
    assert "\n" not in str(refused.value)


def _simulated_counts(rng, sims: int, seeds: int, problems: int, n: int, run_sd: float) -> np.ndarray:
    """Correct counts [2 methods, sims, seeds, problems] of two equal learners, as tests/test_stats.py
    simulates reports: problems of varied difficulty with their own A − B difference, every run shifted on
    all its problems, a run x problem noise and n binomial samples."""
    level = rng.normal(*DIFFICULTY, size=(1, sims, 1, problems))
    own = PROBLEM_SD * rng.normal(size=(1, sims, 1, problems))
    offset = np.concatenate([own / 2, -own / 2])
    runs = _run_logit_sd(run_sd) * rng.normal(size=(2, sims, seeds, 1))
    noise = INTERACTION_SD * rng.normal(size=(2, sims, seeds, problems))
    return rng.binomial(n, special.expit(level + offset + runs + noise))


@pytest.mark.parametrize(("seeds", "problems", "samples"), [(6, 256, 2), (3, 64, 16), (10, 128, 1)])
def test_the_projection_from_a_small_report_predicts_the_variance_at_another_size(seeds, problems, samples):
    """A pilot report (4 seeds x 128 problems x 8 samples, runs that differ by 2 points) projects var(D̄) at
    another size; the mean projection over 300 pilots is within 12 % of the variance 3,000 simulated reports
    of that size show. Sampling is ~40 % of it there: a projection that kept the pilot's samples per problem
    (samples_scale 1) would miss by a factor of up to 2."""
    rng = np.random.default_rng(7)
    pilots = _simulated_counts(rng, 300, 4, 128, 8, run_sd=2.0)
    projected = np.mean(
        [
            stats.difference(pilots[0, i], pilots[1, i], 8).parts.variance(seeds, problems, samples / 8)
            for i in range(300)
        ]
    )
    reports = _simulated_counts(rng, 3000, seeds, problems, samples, run_sd=2.0)
    actual = np.var((reports[0] - reports[1]).mean(axis=(-2, -1)) * 100.0 / samples)
    assert projected / actual == pytest.approx(1.0, abs=0.12)


def test_compare_prints_what_its_budget_bought(tmp_path):
    from test_cli import ggpo_here

    _write_report(tmp_path / "before")
    refused = ggpo_here(
        "compare", "--pool", str(tmp_path / "absent.parquet"), "--methods", "ggpo,grpo",
        "--budget", "30", "--budget-from", str(tmp_path / "before"), "--out", str(tmp_path / "after"),
    )  # fmt: skip
    lines = refused.stdout.splitlines()
    assert lines[0].startswith("budget: ") and "(seeds 42,1234,2027,1," in lines[0], refused.stdout
    assert lines[1].startswith("  instead of ")
    assert refused.stderr.startswith("error: ") and "absent.parquet" in refused.stderr
    assert not (tmp_path / "after").exists()
    assert json.loads((tmp_path / "before" / COUNTS_FILE).read_text())["methods"] == ["a", "b"]
