"""Paired intervals, p-values and Holm families for "is learner A better than B here?", calibrated for seeds.

Each method is evaluated on the same P problems with the same S seeds (training runs). All numbers here are
percentage points. A paired difference ``D[s, p]`` (A − B on problem p, seed s) is read as a two-way
random-effects layout (Miller 2024, "Adding Error Bars to Evals", for problems as the sampled unit; the
training run is the other one):

    D[s, p] = μ + a[s] + b[p] + e[s, p],   var(D̄) = σ²_seed / S + σ²_problem / P + σ²_residual / (S·P)

with ``a`` the run effect (a run better or worse on every problem), ``b`` the problem's own difference and
``e`` the run × problem interaction plus the sampling noise of n samples. The ANOVA mean squares estimate the
components (Searle, Casella and McCulloch 1992, ch. 4): σ²_seed = (MS_seed − MS_resid) / P, σ²_problem =
(MS_problem − MS_resid) / S, σ²_residual = MS_resid. The squared standard error is their unbiased sum over
the divisors above, (MS_seed + MS_problem − MS_resid) / (S·P), at least MS_resid / (S·P); MS_seed / (S·P)
is the plain variance of the per-seed paired means over S, so this is the t-interval on the per-seed means
with the problem component added. Reports show each component floored at 0.

The quantile is Student's t on **S − 1** degrees of freedom, the seeds' own: when runs differ, the seed term
dominates and it rests on S − 1 of them. Chosen by simulation (tests/test_stats.py: every run shifted on all
its problems by a logit drawn per run, per-run SD of a run's mean 0, 2 and 5 points, 2, 3, 5 and 10 seeds,
128 and 500 problems, n = 8; 2,000 simulations per cell, Monte-Carlo error 0.5 points): equal methods are
resolved in at most 5.0 % of the simulations of any cell and a true 5-point difference is covered in at
least 95.1 %; the estimated variance is 0.94–1.16 times the actual. What was rejected there:
- Satterthwaite degrees of freedom for the same standard error: 10 % of equal methods resolved with 2 seeds
  and run effects, 7–8 % with 3, because its degrees of freedom grow exactly when the seed variance is
  underestimated (a small MS_seed both shrinks the standard error and raises the df);
- a normal (or bootstrap percentile) quantile on the same standard error: up to 28 % with 2 seeds;
- the crossed bootstrap this module used before (percentile over resampled seeds and problems): 26.5 % with
  2 seeds and 18 % with 3 at a 5-point run SD (issue 35's measure).
The price is power where runs do not differ (2 seeds: a t quantile of 12.7); the report's "what it would
take" columns say how many seeds a difference needs. With **one seed** no run variance can be seen: the
interval is over problems only (t on P − 1), describes those two runs and not the learners, and its verdict
is "too few seeds".

Families (Holm 1979): a report makes many comparisons at once; each family's p-values (two-sided, from the
same t) are adjusted by Holm's step-down, and a verdict is "resolved" only when its adjusted p is below 5 %.
The shown interval is the comparison's own 95 % interval; it excludes 0 whenever the verdict is resolved.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ggpo_offline.compare.blocks import Number, number

ALPHA = 0.05
"""Two-sided level of every interval and, after Holm, of every family of verdicts."""
POWER = 0.8
"""The power "what it would take" is computed for."""
MIN_SEEDS = 2
"""The fewest seeds that give a verdict: the calibration test covers 2, 3, 5 and 10."""
MAX_SEEDS = 1000
"""Beyond this many seeds "what it would take" says "more than" (the problems' own spread then dominates)."""

RESOLVED, NOT_RESOLVED, TOO_FEW_SEEDS = "resolved", "not resolved", "too few seeds"


@dataclass(frozen=True)
class Components:
    """The variance components of a paired difference, points² per unit (not yet divided by S, P or S·P)."""

    seed: float
    """σ²_seed: between training runs, on every problem alike (NaN with one seed: not seen)."""
    problem: float
    """σ²_problem: the problems' own differences."""
    residual: float
    """σ²_residual: the run × problem interaction plus sampling noise."""
    sampling: float | None = None
    """The part of ``residual`` that the n samples' binomial noise explains, when counts were given."""

    def variance(self, seeds: int, problems: int, samples_scale: float = 1.0) -> float:
        """var(D̄) at ``seeds`` × ``problems``; ``samples_scale`` multiplies the samples per problem."""
        sampling = self.sampling or 0.0
        residual = self.residual - sampling + sampling / samples_scale
        seed = 0.0 if math.isnan(self.seed) else self.seed
        return seed / seeds + self.problem / problems + residual / (seeds * problems)


def variance_components(diff: np.ndarray, floor: bool = True) -> tuple[np.ndarray, ...]:
    """Grand mean and the ANOVA estimates σ²_seed, σ²_problem, σ²_residual of ``diff`` [..., seeds, problems].
    With one seed σ²_seed is NaN and the problems' sample variance is the residual (nothing to split).
    ``floor``: each component at least 0 (the moment estimates can fall below it)."""
    seeds, problems = diff.shape[-2:]
    grand = diff.mean(axis=(-2, -1), keepdims=True)
    if seeds == 1:
        nothing = np.zeros(grand.shape[:-2])
        return grand[..., 0, 0], nothing + math.nan, nothing, np.var(diff[..., 0, :], axis=-1, ddof=1)
    by_seed = diff.mean(axis=-1, keepdims=True)
    by_problem = diff.mean(axis=-2, keepdims=True)
    ms_seed = problems * np.sum((by_seed - grand) ** 2, axis=(-2, -1)) / (seeds - 1)
    ms_problem = seeds * np.sum((by_problem - grand) ** 2, axis=(-2, -1)) / (problems - 1)
    residual = diff - by_seed - by_problem + grand
    ms_residual = np.sum(residual**2, axis=(-2, -1)) / ((seeds - 1) * (problems - 1))
    seed, problem = (ms_seed - ms_residual) / problems, (ms_problem - ms_residual) / seeds
    if floor:
        seed, problem = np.maximum(seed, 0.0), np.maximum(problem, 0.0)
    return grand[..., 0, 0], seed, problem, ms_residual


def standard_errors(diff: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean, standard error and degrees of freedom of many differences at once, ``diff`` [..., seeds,
    problems]: the one computation behind :func:`paired_interval` (the calibration test calls it on
    thousands of simulated reports). The squared error is the unbiased (MS_seed + MS_problem − MS_resid) /
    (S·P), at least MS_resid / (S·P); the components shown in reports are floored at 0 one by one, which
    would overstate it by up to 1.4 times where runs do not differ (2 seeds)."""
    mean, seed, problem, residual = variance_components(diff, floor=False)
    return (mean, *_error(seed, problem, residual, *diff.shape[-2:]))


def _error(seed, problem, residual, seeds: int, problems: int):
    """Standard error and degrees of freedom from the unfloored components (see standard_errors)."""
    if seeds == 1:
        return np.sqrt(residual / problems), problems - 1
    variance = seed / seeds + problem / problems + residual / (seeds * problems)
    return np.sqrt(np.maximum(variance, residual / (seeds * problems))), seeds - 1


@dataclass(frozen=True)
class Interval:
    """A paired difference in points with its 95 % interval, p-value and what more data would buy."""

    mean: float
    """The observed mean difference, points."""
    low: float
    high: float
    standard_error: float
    df: int
    """Degrees of freedom of the t quantile: seeds − 1 (problems − 1 with one seed)."""
    seeds: int
    problems: int
    p_value: float
    """Two-sided, from the same t; Holm adjusts it within a family (:func:`verdicts`)."""
    parts: Components

    @property
    def calibrated(self) -> bool:
        """Enough seeds for a verdict about the learners (not only about these runs)."""
        return self.seeds >= MIN_SEEDS

    @property
    def resolved(self) -> bool:
        """Calibrated and the interval excludes 0: a family of one (see :func:`verdicts` for more)."""
        return self.calibrated and self.p_value < ALPHA

    @property
    def verdict(self) -> str:
        """resolved, not resolved or too few seeds, as a family of one."""
        return judge([self])[0].verdict

    @property
    def mde(self) -> float:
        """Minimum detectable difference, points: (t_.975 + t_.8) · SE on this interval's df."""
        return power_quantile(self.df) * self.standard_error

    def seeds_needed(self) -> float | None:
        """The fewest seeds at which this observed difference is resolved with 80 % power (as a family of
        one), from the estimated components at the same problems and samples: ``math.inf`` when no number
        of seeds up to MAX_SEEDS does, None with one seed (no run variance to project from)."""
        if not self.calibrated:
            return None
        if self.mean == 0:
            return math.inf
        seeds = np.arange(2, MAX_SEEDS + 1)
        variance = np.array([self.parts.variance(int(s), self.problems) for s in seeds])
        enough = power_quantile(seeds - 1) * np.sqrt(variance) <= abs(self.mean)
        return float(seeds[np.argmax(enough)]) if enough.any() else math.inf

    def number(self) -> Number:
        """E.g. "+4.10 [+1.02, +7.31]"."""
        return number("{:+.2f} [{:+.2f}, {:+.2f}]", self.mean, self.low, self.high)

    def text(self) -> str:
        return self.number().text()

    def needs(self) -> str:
        """What it would take, in words: "MDE 6.1; 7 seeds" (at this size; seeds for the observed mean),
        "more problems" when the problems' own spread alone stops it."""
        needed = self.seeds_needed()
        if needed is None:
            seeds = "seeds unknown (one seed)"
        elif not math.isinf(needed):
            seeds = f"{int(needed)} seeds"
        elif power_quantile(math.inf) * math.sqrt(self.parts.problem / self.problems) >= abs(self.mean):
            seeds = "more problems, not seeds"
        else:
            seeds = f"> {MAX_SEEDS} seeds"
        return f"MDE {self.mde:.1f}; {seeds}"


def t_quantile(df: int) -> float:
    """The two-sided 95 % quantile of Student's t on ``df`` degrees of freedom."""
    return float(stats.t.ppf(1 - ALPHA / 2, df))


def power_quantile(df) -> np.ndarray | float:
    """t_{1-α/2} + t_{power} on ``df``: a difference this many standard errors from 0 is detected with 80 %
    power at two-sided 5 % (the usual approximation to the noncentral t)."""
    return stats.t.ppf(1 - ALPHA / 2, df) + stats.t.ppf(POWER, df)


def paired_interval(diff: np.ndarray, sampling: np.ndarray | None = None) -> Interval:
    """Mean of ``diff`` (per-(seed, problem) differences in points, shape [seeds, problems]) with its 95 %
    t-interval on seeds − 1 degrees of freedom (see the module docstring); ``sampling`` is each cell's
    binomial variance (points²) when known, for the variance split. Exact and deterministic."""
    diff = np.asarray(diff, dtype=np.float64)
    if diff.ndim != 2 or diff.shape[1] < 2:
        raise ValueError(f"diff must be [seeds, problems] with at least 2 problems, got shape {diff.shape}")
    if not np.all(np.isfinite(diff)):
        raise ValueError("diff holds NaN or infinite values")
    seeds, problems = diff.shape
    mean, seed, problem, residual = (float(x) for x in variance_components(diff, floor=False))
    standard_error, df = _error(seed, problem, residual, seeds, problems)
    mean, standard_error = float(mean), float(standard_error)
    part = None if sampling is None else min(float(np.mean(sampling)), residual)
    parts = Components(max(seed, 0.0) if seeds > 1 else seed, max(problem, 0.0), residual, part)
    if standard_error == 0:  # a constant difference: no noise seen, so no width
        p_value = 1.0 if mean == 0 else 0.0
        return Interval(mean, mean, mean, 0.0, df, seeds, problems, p_value, parts)
    half = t_quantile(df) * standard_error
    p_value = float(2 * stats.t.sf(abs(mean) / standard_error, df))
    return Interval(mean, mean - half, mean + half, standard_error, int(df), seeds, problems, p_value, parts)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the given order: the i-th smallest times (m − i),
    made monotone, capped at 1. Valid under any dependence between the comparisons."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Judged:
    """An interval with its verdict inside a family of ``family`` comparisons (Holm)."""

    interval: Interval
    p_holm: float
    family: int

    @property
    def verdict(self) -> str:
        """too few seeds when the seeds cannot give one, resolved when the Holm-adjusted p is below ALPHA,
        not resolved otherwise."""
        if not self.interval.calibrated:
            return TOO_FEW_SEEDS
        return RESOLVED if self.p_holm < ALPHA else NOT_RESOLVED

    @property
    def resolved(self) -> bool:
        return self.verdict == RESOLVED

    def number(self) -> Number:
        """E.g. "+4.10 [+1.02, +7.31] resolved"."""
        return self.kept().number()

    def kept(self) -> "Verdict":
        return Verdict(self.interval.mean, self.interval.low, self.interval.high, self.p_holm, self.verdict)

    def text(self) -> str:
        return self.number().text()


@dataclass(frozen=True)
class Verdict:
    """A judged difference as a report's data file keeps it: the mean, its 95 % interval, the p-value Holm
    adjusted within its family, and the verdict."""

    mean: float
    low: float
    high: float
    p_holm: float
    verdict: str

    @property
    def resolved(self) -> bool:
        return self.verdict == RESOLVED

    def number(self) -> Number:
        """E.g. "+4.10 [+1.02, +7.31] resolved"."""
        return number("{:+.2f} [{:+.2f}, {:+.2f}] {}", self.mean, self.low, self.high, self.verdict)


def judge(intervals: Sequence[Interval]) -> list[Judged]:
    """Every interval of one family with its Holm-adjusted p-value and verdict, in the given order."""
    adjusted = holm([i.p_value for i in intervals])
    return [Judged(i, p, len(intervals)) for i, p in zip(intervals, adjusted, strict=True)]


def verdicts(intervals: Sequence[Interval]) -> list[str]:
    """Each interval's verdict within its family (:class:`Judged`)."""
    return [judged.verdict for judged in judge(intervals)]


def _check_counts(counts: np.ndarray, n: int, name: str) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"{name} must be correct counts [seeds, problems], got shape {counts.shape}")
    if n < 1 or counts.min(initial=0) < 0 or counts.max(initial=0) > n:
        raise ValueError(f"{name} must hold counts between 0 and n = {n}")
    return counts


def sampling_variance(counts: np.ndarray, n: int) -> np.ndarray:
    """Each cell's unbiased binomial variance of mean@n in points², p̂(1 − p̂) / (n − 1) · 100² (0 with
    n = 1: one sample shows no spread)."""
    counts = _check_counts(counts, n, "counts")
    if n == 1:
        return np.zeros(counts.shape)
    rate = counts / n
    return rate * (1 - rate) / (n - 1) * 100.0**2


def difference(a: np.ndarray, b: np.ndarray, n: int) -> Interval:
    """A − B in points from correct counts [seeds, problems] of ``n`` samples each, paired by seed and
    problem (same order in both): the one entry point for a pairwise verdict (``.verdict``)."""
    a, b = _check_counts(a, n, "A"), _check_counts(b, n, "B")
    if a.shape != b.shape:
        raise ValueError(f"A and B must have the same [seeds, problems] shape, got {a.shape} and {b.shape}")
    sampling = sampling_variance(a, n) + sampling_variance(b, n)
    return paired_interval((a - b) * (100.0 / n), sampling)


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
