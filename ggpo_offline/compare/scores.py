"""Per-problem scores in points and the paired intervals between them, read from a comparison's counts."""

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import Number, number
from ggpo_offline.compare.counts import Counts
from ggpo_offline.evaluate.benchmark_scores import pass_at_k

MEAN = "mean@n"


@dataclass(frozen=True)
class Matched:
    """A checkpoint of equal drift: where each run's probe K3 (its drift from π0) first reaches ``level``,
    its scores interpolated between the evaluated checkpoints around that point (`crossing`)."""

    level: float


@dataclass(frozen=True)
class At:
    """Where a score is read: a split, one of its benchmarks (or the suite), and a checkpoint — an update,
    SELECTED (each run's checkpoint chosen on validation) or a Matched drift."""

    split: str
    scope: str
    checkpoint: "int | str | Matched"


def crossing(points: Sequence[tuple[int, float]], level: float) -> tuple[int, int, float] | None:
    """Where a run's drift first reaches ``level``: ``points`` are (update, drift) in update order; returns
    (update before, update after, α) with level = (1 − α)·drift before + α·drift after (α = 0 and one
    update when the first point already reaches it), None when the run never reaches it."""
    if points and points[0][1] >= level:
        return points[0][0], points[0][0], 0.0
    for (before, low), (after, high) in pairwise(points):
        if high >= level:  # low < level here, so high > low
            return before, after, (level - low) / (high - low)
    return None


@dataclass(frozen=True)
class Cell:
    """One table entry: the mean and sample standard deviation of a score over seeds (points)."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        """Sample std (ddof = 1) as the paper reports it; NaN with a single seed."""
        return statistics.stdev(self.values) if len(self.values) > 1 else math.nan

    def number(self) -> Number:
        """The seed mean ± the sample std over seeds (the mean alone with one seed)."""
        if math.isnan(self.std):
            return number("{:.2f}", self.mean)
        return number("{:.2f} ± {:.2f}", self.mean, self.std)


Term = tuple[int, str, At]
"""(sign, method, where): one side of a contrast."""


class Scores:
    """The comparison's scores and paired intervals; an interval or a family, once computed, is kept (the
    report asks for the same ones in several tables)."""

    def __init__(self, counts: Counts):
        self.counts = counts
        self._intervals: dict[tuple, stats.Interval] = {}
        self._families: dict[tuple, dict[tuple[str, str], stats.Judged]] = {}

    def points(self, method: str, at: At, metric: str = MEAN) -> np.ndarray:
        """Per-problem score in points, ``[seeds, problems]``: mean@n is 100·c/n, pass@k its unbiased
        per-problem estimate (SPEC "Evaluation")."""
        if isinstance(at.checkpoint, Matched):
            return self._interpolated(method, at, lambda where: self.points(method, where, metric), 1)
        correct = self.counts.matrix(method, at.split, at.scope, at.checkpoint)
        n = self.counts.n[at.split]
        if metric == MEAN:
            return 100.0 * correct / n
        k = int(metric.removeprefix("pass@"))
        by_count = np.array([100.0 * pass_at_k(n, c, k) for c in range(n + 1)])
        return by_count[correct]

    def cell(self, method: str, at: At, metric: str = MEAN) -> Cell:
        """Mean ± sample std over seeds of each seed's mean over problems."""
        return Cell(tuple(math.fsum(row) / len(row) for row in self.points(method, at, metric).tolist()))

    def contrast(self, terms: tuple[Term, ...], metric: str = MEAN) -> stats.Interval:
        """The paired interval of Σ sign · score, problem by problem within each seed (points); for mean@n
        with the binomial part of its variance (each term's samples are its own)."""
        key = (terms, metric)
        if key not in self._intervals:
            total = sum(sign * self.points(method, at, metric) for sign, method, at in terms)
            sampling = None
            if metric == MEAN:
                cells = dict.fromkeys((method, at) for _, method, at in terms)  # ordered: sums repeat exactly
                sampling = sum(self._sampling(method, at) for method, at in cells)
            self._intervals[key] = stats.paired_interval(total, sampling)
        return self._intervals[key]

    def _interpolated(self, method: str, at: At, read: Callable[[At], np.ndarray], power: int) -> np.ndarray:
        """Each seed's row of ``read`` at ``at``'s Matched level: (1 − α)^power · row before + α^power · row
        after (power 1 for scores, 2 for their sampling variances, the two evaluations' samples being
        independent)."""
        rows, matrices = [], {}  # update -> read's [seeds, problems] there, read once for every seed
        for row, seed in enumerate(self.counts.seeds):
            found = crossing(self.counts.probe_k3(method, seed), at.checkpoint.level)
            if found is None:
                raise ValueError(f"{method}-s{seed} never reaches probe K3 {at.checkpoint.level}")
            before, after, alpha = found
            for update in (before, after):
                if update not in matrices:
                    matrices[update] = read(replace(at, checkpoint=update))
            low, high = matrices[before][row], matrices[after][row]
            rows.append((1 - alpha) ** power * low + alpha**power * high)
        return np.array(rows)

    def _sampling(self, method: str, at: At) -> np.ndarray:
        if isinstance(at.checkpoint, Matched):
            return self._interpolated(method, at, lambda where: self._sampling(method, where), 2)
        correct = self.counts.matrix(method, at.split, at.scope, at.checkpoint)
        return stats.sampling_variance(correct, self.counts.n[at.split])

    def difference(
        self, a: str, b: str, at: At, at_b: At | None = None, metric: str = MEAN
    ) -> stats.Interval:
        """``a`` at ``at`` minus ``b`` at ``at_b`` (default: the same place), paired by seed and problem."""
        return self.contrast(((1, a, at), (-1, b, at_b or at)), metric)

    def pairs(self, methods: list[str], at: At, metric: str = MEAN) -> dict[tuple[str, str], stats.Judged]:
        """Every pair (A listed before B) at one place and metric, A − B judged as one Holm family: the
        pairwise table's and the best-of-row marks' family (the marks compare with the data-selected best,
        so only a family of every pair bounds their false verdicts)."""
        key = (tuple(methods), at, metric)
        if key not in self._families:
            pairs = [(a, b) for i, a in enumerate(methods) for b in methods[i + 1 :]]
            judged = stats.judge([self.difference(a, b, at, metric=metric) for a, b in pairs])
            self._families[key] = dict(zip(pairs, judged, strict=True))
        return self._families[key]

    def improvement(self, a: str, b: str, at: At, metric: str = MEAN) -> float:
        """The probability that ``a`` beats ``b`` (stats.probability_of_improvement)."""
        return stats.probability_of_improvement(self.points(a, at, metric), self.points(b, at, metric))

    def peak(self, method: str, split: str, scope: str) -> int:
        """The update of ``method``'s highest seed-mean mean@n on ``split`` (the earliest among equals)."""
        updates = self.counts.updates(split)
        return max(updates, key=lambda update: (self.cell(method, At(split, scope, update)).mean, -update))
