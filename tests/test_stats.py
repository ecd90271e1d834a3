"""compare/stats.py: exact cases by hand, Holm, and calibration by simulation with training runs that differ.

The simulation is the kind of data the reports hold: problems of varied difficulty (logit ~ N(−0.3, 1.5²)),
each problem's own difference between A and B (logit SD 0.6, about 10 points), every training run shifted on
all its problems by a logit drawn per run (scaled so that a run's mean moves by RUN_SDS points), a run ×
problem logit noise of 0.3, and n = 8 binomial samples. ``python tests/test_stats.py`` prints the table.
"""

import math
import sys
import warnings
from functools import cache

import numpy as np
import pytest
from scipy import optimize, special
from scipy import stats as scipy_stats

from ggpo_offline.compare.stats import (
    MAX_SEEDS,
    NOT_RESOLVED,
    RESOLVED,
    TOO_FEW_SEEDS,
    Components,
    Interval,
    difference,
    holm,
    paired_interval,
    probability_of_improvement,
    sampling_variance,
    standard_errors,
    variance_components,
    verdicts,
)

N = 8
SIMULATIONS = 2000
"""Per cell: the Monte-Carlo error of a 5 % rate is sqrt(.05 · .95 / 2000) = 0.49 points, of 95 % the same."""
SEEDS, PROBLEMS, RUN_SDS, GAINS = (2, 3, 5, 10), (128, 500), (0.0, 2.0, 5.0), (0.0, 5.0)
DIFFICULTY, PROBLEM_SD, INTERACTION_SD = (-0.3, 1.5), 0.6, 0.3
_GRID = np.random.default_rng(12345).normal(size=(2, 200_000))
"""A fixed quadrature sample of (difficulty, problem difference) for the generator's true values."""


def _true_difference(logit_gain: float) -> float:
    """E over problems of p_A − p_B in points for a mean logit gain (exact by symmetry at 0)."""
    level, own = DIFFICULTY[0] + DIFFICULTY[1] * _GRID[0], logit_gain + PROBLEM_SD * _GRID[1]
    return 100.0 * float(np.mean(special.expit(level + own / 2) - special.expit(level - own / 2)))


@cache
def _logit_gain(points: float) -> float:
    return 0.0 if points == 0 else optimize.brentq(lambda g: _true_difference(g) - points, -3.0, 3.0)


def _run_logit_sd(points: float) -> float:
    """The per-run logit shift whose effect on a run's mean accuracy has SD ``points``."""
    level = special.expit(DIFFICULTY[0] + DIFFICULTY[1] * _GRID[0])
    return points / (100.0 * float(np.mean(level * (1 - level))))


def simulate(rng, sims: int, seeds: int, problems: int, run_sd: float, gain: float, methods: int = 2):
    """Correct counts [methods, sims, seeds, problems]: methods 0 and 1 differ by ``gain`` points on average
    (the others equal method 1); each (method, seed) is its own training run."""
    level = rng.normal(*DIFFICULTY, size=(1, sims, 1, problems))
    own = _logit_gain(gain) + PROBLEM_SD * rng.normal(size=(1, sims, 1, problems))
    offset = np.concatenate([own / 2, np.repeat(-own / 2, methods - 1, axis=0)])
    runs = _run_logit_sd(run_sd) * rng.normal(size=(methods, sims, seeds, 1))
    noise = INTERACTION_SD * rng.normal(size=(methods, sims, seeds, problems))
    return rng.binomial(N, special.expit(level + offset + runs + noise))


# Each estimator maps the two methods' points [sims, seeds, problems] to (mean, standard error, df).
def _library(a, b):
    return standard_errors(a - b)


def _normal_quantile(a, b):  # the percentile bootstrap's quantile on the same standard error
    mean, error, _ = standard_errors(a - b)
    return mean, error, math.inf


def _seeds_held_fixed(a, b):  # problems resampled only: the run effect is left out
    mean, _, problem, residual = variance_components(a - b)
    seeds, problems = a.shape[-2:]
    return mean, np.sqrt(problem / problems + residual / (seeds * problems)), problems - 1


def _problems_held_fixed(a, b):  # seeds resampled only: the problems' own differences are left out
    mean, seed, _, residual = variance_components(a - b)
    seeds, problems = a.shape[-2:]
    return mean, np.sqrt(seed / seeds + residual / (seeds * problems)), seeds - 1


def _pairing_broken(a, b):  # A and B as independent samples: each one's problem difficulty counts
    mean = a.mean(axis=(-2, -1)) - b.mean(axis=(-2, -1))
    return mean, np.hypot(standard_errors(a)[1], standard_errors(b)[1]), a.shape[-2] - 1


ESTIMATORS = {
    "library": _library,
    "normal quantile": _normal_quantile,
    "seeds held fixed": _seeds_held_fixed,
    "problems held fixed": _problems_held_fixed,
    "pairing broken": _pairing_broken,
}


@cache
def calibration() -> dict[tuple, dict[str, tuple[float, float, float]]]:
    """Per cell (seeds, problems, run SD, gain), per estimator: share resolved, share covering the true
    difference, and mean estimated variance / actual variance of the mean. The smaller cells are the first
    seeds and problems of the largest one's draws (each cell is still SIMULATIONS independent reports)."""
    rng = np.random.default_rng(2026)
    table = {}
    for run_sd in RUN_SDS:
        for gain in GAINS:
            drawn = 100.0 * simulate(rng, SIMULATIONS, max(SEEDS), max(PROBLEMS), run_sd, gain) / N
            truth = _true_difference(_logit_gain(gain))
            for seeds in SEEDS:
                for problems in PROBLEMS:
                    a, b = drawn[:, :, :seeds, :problems]
                    table[seeds, problems, run_sd, gain] = {
                        name: _rates(*estimate(a, b), truth) for name, estimate in ESTIMATORS.items()
                    }
    return dict(sorted(table.items()))


def _rates(mean, error, df, truth):
    half = scipy_stats.t.ppf(0.975, df) * error
    resolved = float(np.mean(np.abs(mean) > half))
    covered = float(np.mean(np.abs(mean - truth) <= half))
    return resolved, covered, float(np.mean(error**2) / np.var(mean, ddof=1))


def _failures(name: str) -> list[str]:
    """The cells where an estimator breaks the calibration rules: equal methods resolved in more than 6 %,
    the truth covered in less than 93 %, or a variance estimate off by more than 20-30 %."""
    found = []
    for cell, rates in calibration().items():
        resolved, covered, ratio = rates[name]
        if cell[3] == 0 and resolved > 0.06:
            found.append(f"{cell}: equal methods resolved {resolved:.3f}")
        if covered < 0.93:
            found.append(f"{cell}: covered {covered:.3f}")
        if not 0.8 <= ratio <= 1.3:
            found.append(f"{cell}: variance ratio {ratio:.2f}")
    return found


def test_intervals_are_calibrated_with_training_runs_that_differ():
    # Measured (2,000 per cell): equal methods resolved 0.0-5.0 %, coverage 95.1-100 %, variance ratio
    # 0.94-1.16; a 5-point difference resolved 0 % (2 seeds) to 100 % (10 seeds, 500 problems).
    assert _failures("library") == []
    assert calibration()[10, 500, 0.0, 5.0]["library"][0] == 1.0  # and it has power where data allow


@pytest.mark.parametrize("mutant", [m for m in ESTIMATORS if m != "library"])
def test_the_calibration_fails_each_mutation(mutant):
    # Measured: normal quantile, equal methods resolved up to 27.8 % (2 seeds, run SD 5); seeds held fixed,
    # up to 74.2 %; problems held fixed, up to 19.7 % (10 seeds, no run effect); pairing broken, variance
    # up to 9.2 times too large.
    assert _failures(mutant)


@pytest.mark.parametrize("seeds", [3, 5])
def test_with_many_equal_methods_holm_keeps_false_verdicts_in_a_table_under_six_percent(seeds):
    # Nine equal learners, a 5-point run SD, 128 problems: the pairwise table at one place (36 pairs), with
    # the library's errors and Holm. Measured (1,000 tables): a table with any pair resolved 0.0 % (3 seeds)
    # and 1.4 % (5 seeds) with Holm; 58 % and 66 % when each pair is judged alone.
    rng = np.random.default_rng(7)
    tables, methods = 1000, 9
    points = 100.0 * simulate(rng, tables, seeds, 128, 5.0, 0.0, methods=methods) / N
    pairs = [(i, j) for i in range(methods) for j in range(i + 1, methods)]
    means, errors, df = zip(*(standard_errors(points[i] - points[j]) for i, j in pairs), strict=True)
    p_values = 2 * scipy_stats.t.sf(np.abs(np.array(means)) / np.array(errors), df[0])  # [pairs, tables]
    with_holm = np.mean([min(holm(list(p_values[:, t]))) < 0.05 for t in range(tables)])
    alone = np.mean((p_values < 0.05).any(axis=0))
    assert with_holm <= 0.06
    assert alone > 0.3  # the family is what keeps it down


def test_the_minimum_detectable_difference_has_about_80_percent_power():
    # 5 seeds, 128 problems, run SD 2: the median MDE of equal methods, then a true difference of that size.
    rng = np.random.default_rng(11)
    a, b = 100.0 * simulate(rng, SIMULATIONS, 5, 128, 2.0, 0.0) / N
    _, error, df = standard_errors(a - b)
    mde = float(np.median((scipy_stats.t.ppf(0.975, df) + scipy_stats.t.ppf(0.8, df)) * error))
    a, b = 100.0 * simulate(rng, SIMULATIONS, 5, 128, 2.0, mde) / N
    mean, error, df = standard_errors(a - b)
    power = float(np.mean(np.abs(mean) > scipy_stats.t.ppf(0.975, df) * error))
    assert 0.72 <= power <= 0.88  # measured 0.75 (the t-sum is an approximation to the noncentral t)


def test_identical_methods_give_zero_and_a_zero_width_interval():
    counts = np.random.default_rng(0).integers(0, 9, size=(3, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = difference(counts, counts, 8)
    assert (result.mean, result.low, result.high, result.standard_error) == (0.0, 0.0, 0.0, 0.0)
    assert result.p_value == 1.0 and result.verdict == NOT_RESOLVED
    assert result.text() == "+0.00 [+0.00, +0.00]"


def test_a_constant_difference_gives_a_zero_width_interval_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = paired_interval(np.full((2, 30), 12.5))
    assert (result.low, result.high, result.p_value) == (12.5, 12.5, 0.0)
    assert result.verdict == RESOLVED


def test_the_interval_is_the_t_interval_on_seeds_minus_one_by_hand():
    # D = grand 5 + seed effects (-2, 0, 2) + problem effects (-1, 1, -1, 1) + interaction g (rows sum to 0
    # and columns sum to 0). MS_seed = 4 · 8 / 2 = 16; MS_problem = 3 · 4 / 3 = 4; MS_resid = Σg² / 6 = 2/3.
    g = np.array([[1, -1, 0, 0], [-1, 1, 0, 0], [0, 0, 0, 0]], dtype=float)
    diff = 5.0 + np.array([[-2.0], [0.0], [2.0]]) + np.array([[-1.0, 1.0, -1.0, 1.0]]) + g
    result = paired_interval(diff)
    seed, problem, residual = (16 - 2 / 3) / 4, (4 - 2 / 3) / 3, 2 / 3
    assert result.parts == Components(seed, problem, residual, None)
    error = math.sqrt(seed / 3 + problem / 4 + residual / 12)
    assert result.standard_error == pytest.approx(error, abs=1e-12)
    assert (result.df, result.seeds, result.problems) == (2, 3, 4)
    assert result.high - 5.0 == pytest.approx(4.302652729749464 * error, abs=1e-9)  # t_.975 on 2 df
    assert result.p_value == pytest.approx(2 * scipy_stats.t.sf(5.0 / error, 2), abs=1e-12)


def test_a_seed_component_below_zero_is_shown_as_zero_and_the_error_stays_unbiased():
    # Seeds ±0.5, problems ±4, interaction ±1/±3 with zero row and column sums: MS_seed = 4 · 0.5 / 1 = 2,
    # MS_problem = 2 · 4 · 16 / 3 = 128 / 3, MS_resid = 2 · 20 / 3 = 40 / 3. The seed component (2 − 40/3)
    # / 4 < 0 is shown as 0; the squared error keeps it: (2 + 128/3 − 40/3) / 8.
    g = np.array([[1.0, -1.0, 3.0, -3.0], [-1.0, 1.0, -3.0, 3.0]])
    diff = 2.0 + np.array([[0.5], [-0.5]]) + np.array([[-4.0, 4.0, -4.0, 4.0]]) + g
    result = paired_interval(diff)
    assert result.parts == Components(0.0, (128 / 3 - 40 / 3) / 2, 40 / 3, None)
    assert result.standard_error**2 == pytest.approx((2 + 128 / 3 - 40 / 3) / 8, abs=1e-12)
    # Nothing but interaction: the unbiased sum is below 0, so the error is the residual's alone.
    assert paired_interval(2.0 + g).standard_error ** 2 == pytest.approx(40 / 3 / 8, abs=1e-12)


def test_one_seed_is_over_problems_only_and_too_few_seeds():
    diff = np.random.default_rng(3).normal(2.0, 10.0, size=(1, 50))
    result = paired_interval(diff)
    plain = scipy_stats.ttest_1samp(diff[0], 0.0)
    assert (result.low, result.high) == pytest.approx(tuple(plain.confidence_interval()), abs=1e-9)
    assert result.df == 49 and result.verdict == TOO_FEW_SEEDS
    far = paired_interval(diff + 50.0)  # however far from 0, one run of each learner cannot say
    assert far.low > 0 and far.verdict == TOO_FEW_SEEDS and not far.resolved
    assert far.seeds_needed() is None and far.needs().endswith("seeds unknown (one seed)")


def test_difference_is_a_minus_b_in_points_and_symmetric():
    a = np.array([[3, 5, 8], [4, 6, 1]])
    b = np.array([[1, 5, 8], [4, 2, 0]])
    forward, backward = difference(a, b, 8), difference(b, a, 8)
    assert forward.mean == pytest.approx(87.5 / 6, abs=1e-12)  # (2, 0, 0, 0, 4, 1) of 8 samples
    assert backward.mean == pytest.approx(-forward.mean, abs=1e-12)
    assert (backward.low, backward.high) == pytest.approx((-forward.high, -forward.low), abs=1e-9)
    assert backward.p_value == pytest.approx(forward.p_value, abs=1e-12)
    # The sampling part: p̂(1 − p̂) / (n − 1) per cell of both methods, averaged, at most the residual.
    expected = np.mean(sampling_variance(a, 8) + sampling_variance(b, 8))
    assert forward.parts.sampling == pytest.approx(min(expected, forward.parts.residual), abs=1e-12)


def test_sampling_variance_by_hand():
    assert sampling_variance(np.array([[4, 8, 0, 2]]), 8)[0].tolist() == pytest.approx(
        [0.25 / 7 * 1e4, 0.0, 0.0, 0.1875 / 7 * 1e4]
    )
    assert sampling_variance(np.array([[0, 1]]), 1).tolist() == [[0.0, 0.0]]


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.03, 0.04 times 4, 3, 2, 1 = 0.04, 0.06, 0.06, 0.04 -> monotone 0.04 0.06 0.06 0.06
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def _interval(p_value: float, seeds: int = 3) -> Interval:
    return Interval(1.0, 0.5, 1.5, 0.25, seeds - 1, seeds, 100, p_value, Components(1.0, 1.0, 1.0))


def test_verdicts_in_a_family():
    # 0.01 alone is resolved; among four its Holm p is 0.04 (resolved), the others' 0.06 (not resolved).
    assert _interval(0.01).verdict == RESOLVED and _interval(0.03).verdict == RESOLVED
    family = [_interval(p) for p in (0.03, 0.01, 0.04, 0.02)]
    assert verdicts(family) == [NOT_RESOLVED, RESOLVED, NOT_RESOLVED, NOT_RESOLVED]
    assert verdicts([_interval(0.001, seeds=1), _interval(0.001)]) == [TOO_FEW_SEEDS, RESOLVED]


def test_mde_and_the_seeds_a_difference_needs_by_hand():
    parts = Components(seed=9.0, problem=2.56, residual=64.0)  # σ² per run, per problem, per cell
    interval = Interval(3.0, 0.0, 6.0, math.sqrt(parts.variance(3, 128)), 2, 3, 128, 0.2, parts)
    assert interval.mde == pytest.approx((4.302653 + 1.060660) * interval.standard_error, abs=1e-5)
    needed = interval.seeds_needed()
    power = [
        (scipy_stats.t.ppf(0.975, s - 1) + scipy_stats.t.ppf(0.8, s - 1)) * math.sqrt(parts.variance(s, 128))
        for s in (needed - 1, needed)
    ]
    assert power[0] > 3.0 >= power[1]  # the fewest seeds that reach 80 % power for +3.0
    assert interval.needs() == f"MDE {interval.mde:.1f}; {int(needed)} seeds"
    # The problems' own spread alone (2.56 / 128, SE 0.14, times 2.80) exceeds a +0.3 difference.
    tiny = Interval(0.3, -1, 1, interval.standard_error, 2, 3, 128, 0.9, parts)
    assert tiny.seeds_needed() == math.inf and tiny.needs().endswith("; more problems, not seeds")
    # +0.45 clears the problems' limit (0.40) but not 1000 seeds' (2.80 · sqrt(9/1000 + 2.56/128 + …) = 0.48).
    beyond = Interval(0.45, -1, 1, interval.standard_error, 2, 3, 128, 0.9, parts)
    assert beyond.seeds_needed() == math.inf and beyond.needs().endswith(f"> {MAX_SEEDS} seeds")


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
    with pytest.raises(ValueError, match="NaN or infinite"):
        paired_interval(np.array([[1.0, math.nan]]))


if __name__ == "__main__":  # the calibration table of the closing note and the module docstring
    print("| seeds | problems | run SD | gain | " + " | ".join(ESTIMATORS) + " |", file=sys.stdout)
    for cell, rates in calibration().items():
        cells = " | ".join(f"{r:.3f} / {c:.3f} / {v:.2f}" for r, c, v in rates.values())
        print(f"| {' | '.join(map(str, cell))} | {cells} |")
