"""Paired intervals of compare/stats.py: exact cases by hand, a known truth, and calibration by simulation."""

import math
import tracemalloc
import warnings

import numpy as np
import pytest
from scipy import stats

from ggpo_offline.compare.stats import (
    Interval,
    difference,
    minimum_detectable_difference,
    paired_interval,
    probability_of_improvement,
)

POWER_Z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)  # 2.801585


def _methods(rng: np.random.Generator, seeds: int, problems: int, n: int, gain: float = 0.0):
    """Correct counts [seeds, problems] of A and B on problems of Beta-drawn difficulty; A's per-problem
    gain is uniform on [0, 2 * gain], so the true mean difference is ``gain`` (a fraction)."""
    p_b = 0.8 * rng.beta(2, 3, size=problems)
    p_a = p_b + (rng.uniform(0, 2 * gain, size=problems) if gain else 0.0)
    return rng.binomial(n, p_a, size=(seeds, problems)), rng.binomial(n, p_b, size=(seeds, problems))


def test_identical_methods_give_zero_and_a_zero_width_interval():
    counts = np.random.default_rng(0).integers(0, 9, size=(3, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = difference(counts, counts, 8)
    assert result == Interval(mean=0.0, low=0.0, high=0.0, standard_error=0.0)
    assert not result.resolved
    assert result.text() == "+0.00 [+0.00, +0.00]"


def test_a_constant_difference_gives_a_zero_width_interval_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = paired_interval(np.full((2, 30), 12.5))
    assert result == Interval(mean=12.5, low=12.5, high=12.5, standard_error=0.0)
    assert result.resolved


def test_difference_is_a_minus_b_in_points():
    a = np.array([[3, 5, 8], [4, 6, 1]])
    b = np.array([[1, 5, 8], [4, 2, 0]])
    # differences (2, 0, 0, 0, 4, 1) of 8 samples = 25, 0, 0, 0, 50, 12.5 points; mean 87.5 / 6
    forward, backward = difference(a, b, 8), difference(b, a, 8)
    assert forward.mean == pytest.approx(87.5 / 6, abs=1e-12)
    assert forward.low > 0 and forward.resolved
    # Same seed, same resamples: B − A is the mirror image of A − B.
    assert backward.mean == pytest.approx(-forward.mean, abs=1e-12)
    assert (backward.low, backward.high) == pytest.approx((-forward.high, -forward.low), abs=1e-9)


def test_interval_text_resolution_and_mde():
    interval = Interval(mean=4.1, low=1.02, high=7.31, standard_error=1.5)
    assert interval.text() == "+4.10 [+1.02, +7.31]"
    assert interval.resolved
    assert interval.mde == pytest.approx((1.959964 + 0.841621) * 1.5, abs=1e-6)
    assert Interval(-1.0, -2.5, -0.01, 0.6).text() == "-1.00 [-2.50, -0.01]"
    assert Interval(-1.0, -2.5, -0.01, 0.6).resolved
    assert not Interval(1.0, 0.0, 2.0, 0.5).resolved  # an interval touching 0 does not exclude it


def test_probability_of_improvement_by_hand():
    a = np.array([[3, 4], [2, 6]])
    b = np.array([[2, 2], [1, 5]])
    # problem 0: a {3, 2} vs b {2, 1}: 3>2, 3>1, 2=2 (½), 2>1 -> 3.5 / 4
    # problem 1: a {4, 6} vs b {2, 5}: 4>2, 4<5, 6>2, 6>5   -> 3 / 4
    assert probability_of_improvement(a, b) == pytest.approx((0.875 + 0.75) / 2, abs=1e-12)
    assert probability_of_improvement(b, a) == pytest.approx(1 - 0.8125, abs=1e-12)
    assert probability_of_improvement(a[:1], b) == pytest.approx((1.0 + 0.5) / 2, abs=1e-12)


def test_bad_shapes_and_counts_are_refused():
    with pytest.raises(ValueError, match=r"same \[seeds, problems\] shape, got \(3, 5\) and \(2, 5\)"):
        difference(np.zeros((3, 5), int), np.zeros((2, 5), int), 8)
    with pytest.raises(ValueError, match=r"A must be correct counts \[seeds, problems\], got shape \(5,\)"):
        difference(np.zeros(5, int), np.zeros(5, int), 8)
    with pytest.raises(ValueError, match="B must hold counts between 0 and n = 8"):
        difference(np.zeros((2, 5), int), np.full((2, 5), 9), 8)
    with pytest.raises(ValueError, match="same problems, got"):
        probability_of_improvement(np.zeros((3, 5)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="at least 2 problems"):
        paired_interval(np.zeros((3, 1)) + 1.0)


def test_seed_effects_count_once_without_the_interaction():
    # D = 5 + seed effect (-2, 0, 2) + an interaction g whose problem means are 0: every problem mean is
    # 5, so only the seeds vary. By hand: MS_seed = P * 8 / 2 = 16, MS_interaction = sum(g²) / (2 * 3)
    # = 4/3, seed variance = (16 - 4/3) / 4 = 11/3, effects rescaled by sqrt((11/3) / (8/3)). A resample of
    # three seeds is all the lowest one with probability 1/27 > 2.5 %, so the bounds are 5 -+ 2 * that.
    g = np.array([[1, -1, 1, -1], [-1, 1, -1, 1], [0, 0, 0, 0]])
    diff = 5.0 + np.array([[-2.0], [0.0], [2.0]]) + g
    result = paired_interval(diff)
    half_width = 2 * math.sqrt(11 / 8)
    assert (result.low, result.high) == pytest.approx((5 - half_width, 5 + half_width), abs=1e-9)
    # Seed effects no larger than the interaction are noise already in the problem means: nothing added.
    assert paired_interval(5.0 + np.array([[-0.1], [0.0], [0.1]]) + 4 * g).standard_error == 0.0


def test_one_seed_resamples_problems_only():
    diff = np.random.default_rng(3).normal(2.0, 10.0, size=(1, 50))
    result = paired_interval(diff, resamples=999, seed=7)
    plain = stats.bootstrap(
        (diff[0],), np.mean, n_resamples=999, method="percentile", random_state=np.random.default_rng(7)
    )
    assert (result.low, result.high) == pytest.approx(tuple(plain.confidence_interval), abs=1e-12)
    assert result.standard_error == pytest.approx(plain.standard_error, abs=1e-12)


def test_same_input_and_seed_give_the_same_interval():
    a, b = _methods(np.random.default_rng(4), seeds=3, problems=100, n=8, gain=0.05)
    assert difference(a, b, 8, seed=11) == difference(a, b, 8, seed=11)
    assert difference(a, b, 8, seed=11) != difference(a, b, 8, seed=12)


def test_a_true_ten_point_difference_is_resolved_and_covered():
    a, b = _methods(np.random.default_rng(5), seeds=3, problems=500, n=8, gain=0.10)
    result = difference(a, b, 8)
    assert result.resolved
    assert result.low <= 10.0 <= result.high


def test_bootstrap_memory_stays_bounded():
    a, b = _methods(np.random.default_rng(6), seeds=3, problems=500, n=8)
    tracemalloc.start()
    try:
        difference(a, b, 8, resamples=4999)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # batches of 2097 resamples: int64 indices and the gathered means, 2 x 8 MiB; 40 MiB unbatched
    assert peak < 24 * 2**20


def _simulate(gain: float, runs: int = 400) -> tuple[float, float]:
    """Share of intervals missing the true difference, and mean bootstrap SE / actual spread of the mean."""
    rng = np.random.default_rng(2024)
    misses, errors, means = 0, [], []
    for run in range(runs):
        a, b = _methods(rng, seeds=3, problems=300, n=8, gain=gain)
        result = difference(a, b, 8, resamples=999, seed=run)
        misses += not result.low <= 100 * gain <= result.high
        errors.append(result.standard_error)
        means.append(result.mean)
    return misses / runs, float(np.mean(errors) / np.std(means, ddof=1))


def test_equal_methods_are_resolved_about_five_percent_of_the_time():
    # Measured: 3.0 % resolved, SE ratio 1.15 (the seed component, floored at 0, adds a little). The plain
    # crossed bootstrap: 0.25 % and 1.53; seeds only: 22 % and 0.74; unpaired A and B: 0 % and 2.06.
    false_positives, se_ratio = _simulate(gain=0.0)
    assert 0.01 <= false_positives <= 0.10
    assert 0.85 <= se_ratio <= 1.35


def test_a_known_difference_is_covered_about_95_percent_of_the_time():
    misses, se_ratio = _simulate(gain=0.05)  # measured: 97.75 % covered, SE ratio 1.19
    assert 0.90 <= 1 - misses <= 0.99
    assert 0.85 <= se_ratio <= 1.35


def test_minimum_detectable_difference_by_hand():
    # one seed: p̂ = .5, 1, 0, .25 -> sum p̂(1 - p̂) / 7 = .4375 / 7; SE² = that / 4 problems²
    one_seed = minimum_detectable_difference(np.array([[4, 8, 0, 2]]), 8)
    assert one_seed == pytest.approx(POWER_Z * math.sqrt(2) * 100 * math.sqrt(0.4375 / 7 / 16), abs=1e-9)
    # [[25, 75], [50, 50]] points: no seed effect, interaction ±12.5 -> MS_interaction = 625, SE² = 625 / 4
    interaction = minimum_detectable_difference(np.array([[2, 6], [4, 4]]), 8)
    assert interaction == pytest.approx(POWER_Z * math.sqrt(2) * 12.5, abs=1e-9)
    # [[0, 25], [50, 75]] points: seed effects ±25, no interaction -> MS_seed = 2 * 1250 = 2500, SE = 25
    seeds = minimum_detectable_difference(np.array([[0, 2], [4, 6]]), 8)
    assert seeds == pytest.approx(POWER_Z * math.sqrt(2) * 25, abs=1e-9)
    with pytest.raises(ValueError, match="need 2 seeds or n >= 2"):
        minimum_detectable_difference(np.array([[0, 1, 1]]), 1)
