"""Paired intervals for "is learner A better than B here?" from per-problem correct counts over seeds.

Each method is evaluated on the same P problems with the same S seeds, as counts of correct answers out of
n samples, a matrix ``[seeds, problems]``. All numbers here are percentage points.

Why scipy and not rliable: rliable's stratified bootstrap resamples runs within each task and treats the
tasks (here: problems) as fixed, and it would pull arch and seaborn into the package. Miller 2024, "Adding
Error Bars to Evals", treats the problems as the sampled unit; the seeds (training runs) are the second
source of variance. Both are resampled here, independently (a crossed bootstrap), with
``scipy.stats.bootstrap``.

Why not the plain crossed ("pigeonhole") bootstrap, which resamples seeds and problems of the difference
matrix itself: it counts the seed × problem interaction (binomial noise included) up to three times
(McCullagh 2000, "Resampling and exchangeable arrays"; Owen 2007, "The pigeonhole bootstrap"). In
simulations with 3 seeds and 300–500 problems its standard error was 1.5 times too wide, and two equal
methods were resolved as different in under 1 % of comparisons instead of 5 %. So the difference is split
as in a two-way ANOVA, ``D[s, p] = grand + seed effect[s] + (problem mean[p] - grand)``: seeds resample
the seed effects, shrunk so that their spread equals the moment estimate of the seed variance component
(Carpenter, Goldstein and Rasbash 2003), and problems resample the per-problem means over seeds, which
already carry the interaction once. The bootstrap variance then estimates
``var(seed)/S + var(problem)/P + var(interaction)/(S*P)``; in the same simulations two equal methods were
resolved in 3 % of comparisons, the standard error 1.15 times the true spread (the seed component, floored
at 0, adds a little when seeds do not differ).

Limitation: with 2–3 seeds the seed component rests on 1–2 degrees of freedom, and no bootstrap recovers
the wide Student-t quantile that implies. When seeds differ systematically (one training run better on
all problems), the intervals are too narrow (3 seeds, seed std of 1 point per run: equal methods resolved
in ~15 % of comparisons); more seeds are the remedy.
"""

from dataclasses import dataclass

import numpy as np
from scipy import stats

_POWER_Z = float(stats.norm.ppf(0.975) + stats.norm.ppf(0.8))
"""(z_.975 + z_.8): a difference this many standard errors from 0 is detected with 80 % power at 5 %."""

_BATCH_ELEMENTS = 1 << 20
"""Resampled indices per problem batch (8 MiB as int64), so memory does not grow with ``resamples``."""


@dataclass(frozen=True)
class Interval:
    """A paired difference in points with its 95 % interval."""

    mean: float
    """The observed mean difference, points."""
    low: float
    high: float
    standard_error: float
    """Bootstrap std of the statistic, points."""

    @property
    def resolved(self) -> bool:
        """The interval excludes 0: A and B differ at this confidence."""
        return self.low > 0 or self.high < 0

    @property
    def mde(self) -> float:
        """Minimum detectable difference, points: 80 % power at two-sided 5 %, (z_.975 + z_.8) * SE."""
        return _POWER_Z * self.standard_error

    def text(self) -> str:
        """E.g. "+4.10 [+1.02, +7.31]"."""
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def _two_way(values: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Seed effects ``[S]`` and the ANOVA mean squares of seeds and of the seed × problem interaction."""
    seeds, problems = values.shape
    grand = values.mean()
    seed_effect = values.mean(axis=1) - grand
    if seeds < 2:
        return seed_effect, 0.0, 0.0
    residual = values - values.mean(axis=1, keepdims=True) - values.mean(axis=0, keepdims=True) + grand
    ms_seed = problems * float(np.sum(seed_effect**2)) / (seeds - 1)
    ms_interaction = float(np.sum(residual**2)) / ((seeds - 1) * (problems - 1))
    return seed_effect, ms_seed, ms_interaction


def _seed_effects(diff: np.ndarray) -> np.ndarray:
    """Seed effects rescaled so their spread (ddof 0) is the moment estimate of the seed variance,
    max(0, (MS_seed - MS_interaction) / P): the raw ones also carry the interaction, already counted
    in the problem means."""
    seeds, problems = diff.shape
    effect, ms_seed, ms_interaction = _two_way(diff)
    if ms_seed <= ms_interaction:
        return np.zeros(seeds)
    component = (ms_seed - ms_interaction) / problems
    return effect * np.sqrt(component / float(np.mean(effect**2)))


def paired_interval(
    diff: np.ndarray, *, confidence: float = 0.95, resamples: int = 4999, seed: int = 0
) -> Interval:
    """Mean of ``diff`` (per-(seed, problem) differences in points, shape [seeds, problems]) with a crossed
    bootstrap interval: seeds and problems resampled independently (see the module docstring).

    Percentile interval, not BCa: BCa's acceleration comes from a jackknife, which over 2–3 seeds is
    unstable (and undefined on one); the statistic is a mean, for which percentile is adequate. With one
    seed only problems are resampled. Deterministic for a given ``seed``.
    """
    diff = np.asarray(diff, dtype=np.float64)
    if diff.ndim != 2 or diff.shape[1] < 2:
        raise ValueError(f"diff must be [seeds, problems] with at least 2 problems, got shape {diff.shape}")
    if not np.all(np.isfinite(diff)):
        raise ValueError("diff holds NaN or infinite values")
    mean = float(diff.mean())
    if np.ptp(diff) == 0:
        # Every resample would give the same value; scipy is not needed for a zero-width interval.
        return Interval(mean=mean, low=mean, high=mean, standard_error=0.0)
    seeds, problems = diff.shape
    problem_means = diff.mean(axis=0)
    seed_effects = _seed_effects(diff)

    def crossed(rows: np.ndarray, columns: np.ndarray, axis: int = -1) -> np.ndarray:
        # rows [B, S], columns [B, P]: the resampled seeds and problems of B resamples
        return seed_effects[rows].mean(axis=axis) + problem_means[columns].mean(axis=axis)

    def problems_only(columns: np.ndarray, axis: int = -1) -> np.ndarray:
        return problem_means[columns].mean(axis=axis)

    # scipy refuses a one-element sample, and one seed has no seed variance to resample anyway.
    samples = (np.arange(seeds), np.arange(problems)) if seeds > 1 else (np.arange(problems),)
    statistic = crossed if seeds > 1 else problems_only
    result = stats.bootstrap(
        samples,
        statistic,
        n_resamples=resamples,
        batch=max(1, _BATCH_ELEMENTS // problems),
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval
    return Interval(mean=mean, low=float(low), high=float(high), standard_error=float(result.standard_error))


def _check_counts(counts: np.ndarray, n: int, name: str) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"{name} must be correct counts [seeds, problems], got shape {counts.shape}")
    if n < 1 or counts.min(initial=0) < 0 or counts.max(initial=0) > n:
        raise ValueError(f"{name} must hold counts between 0 and n = {n}")
    return counts


def difference(a: np.ndarray, b: np.ndarray, n: int, **kwargs) -> Interval:
    """A − B in points from correct counts [seeds, problems] of ``n`` samples each, paired by seed and
    problem (same order in both); ``kwargs`` go to :func:`paired_interval`."""
    a, b = _check_counts(a, n, "A"), _check_counts(b, n, "B")
    if a.shape != b.shape:
        raise ValueError(f"A and B must have the same [seeds, problems] shape, got {a.shape} and {b.shape}")
    return paired_interval((a - b) * (100.0 / n), **kwargs)


def probability_of_improvement(a: np.ndarray, b: np.ndarray) -> float:
    """rliable's P(A > B) (Agarwal et al. 2021): per problem, over all seed pairs (i, j),
    P(a[i, p] > b[j, p]) + ½ P(a[i, p] = b[j, p]); averaged over problems. ``a`` and ``b`` are [seeds,
    problems] scores on the same problems; their seed counts may differ."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"A and B must be [seeds, problems] on the same problems, got {a.shape}, {b.shape}")
    left, right = a[:, None, :], b[None, :, :]  # [Sa, 1, P], [1, Sb, P]
    wins = (left > right).mean(axis=(0, 1)) + 0.5 * (left == right).mean(axis=(0, 1))  # [P]
    return float(wins.mean())


def minimum_detectable_difference(counts: np.ndarray, n: int) -> float:
    """The smallest A − B, in points, that a paired comparison of this evaluation size detects with 80 %
    power at two-sided 5 %: (z_.975 + z_.8) * sqrt(2) * SE, where SE is the noise part of this method's
    mean (e.g. the base model's counts [seeds, problems] of ``n`` samples).

    Assumes the other method is as noisy as this one and independent of it given the problem (hence
    sqrt(2)); the problems are shared, so their difficulty cancels and only seed and sampling noise count:
    SE² = max(MS_seed, MS_interaction) / (S * P), the same components as :func:`paired_interval`. With one
    seed the seed variance cannot be seen and only the binomial noise of ``n`` samples counts,
    SE² = mean(p̂(1 - p̂) / (n - 1)) / P — a lower bound when training seeds differ.
    """
    counts = _check_counts(counts, n, "counts")
    seeds, problems = counts.shape
    if problems < 2:
        raise ValueError(f"counts must cover at least 2 problems, got shape {counts.shape}")
    points = counts * (100.0 / n)
    if seeds > 1:
        _, ms_seed, ms_interaction = _two_way(points)
        variance = max(ms_seed, ms_interaction) / (seeds * problems)
    elif n > 1:
        rate = counts[0] / n
        variance = float(np.mean(rate * (1 - rate) / (n - 1))) * 100.0**2 / problems
    else:
        raise ValueError("one seed of n = 1 sample gives no estimate of the noise; need 2 seeds or n >= 2")
    return _POWER_Z * np.sqrt(2.0) * float(np.sqrt(variance))
