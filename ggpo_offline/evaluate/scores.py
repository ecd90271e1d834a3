"""Scores from per-problem correct counts (SPEC "Evaluation"): unbiased pass@k and mean@n."""

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples (Chen et al. 2021, Eq. 1):
    ``1 − C(n−c, k)/C(n, k)``, computed as ``1 − ∏_{i=n−c+1}^{n} (1 − k/i)``; 1 when ``k > n−c``.
    ``pass_at_k(n, c, 1) = c/n``."""
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if k > n - c:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def reported_ks(ks: Sequence[int], n: int) -> list[int]:
    """The pass@k values reported for ``n`` samples: the distinct ``k <= n``, ascending."""
    return sorted({k for k in ks if k <= n})


def aggregate(counts: dict[str, dict[str, int]], n: int, ks: Sequence[int]) -> dict:
    """Benchmark and suite scores from per-problem correct counts ``{benchmark: {prompt_id: c}}``.

    A benchmark averages over its problems; the suite averages over the problems of all benchmarks
    together (problem-weighted: each problem counts once, so it is not the mean of benchmark means).
    Returns ``{"benchmarks": {name: scores + {"counts"}}, "suite": scores}``, where scores are
    ``num_problems``, ``mean@n`` and ``pass@k`` for each reported k.
    """
    ks = reported_ks(ks, n)
    benchmarks = {
        name: {**_scores(list(by_problem.values()), n, ks), "counts": dict(by_problem)}
        for name, by_problem in counts.items()
    }
    suite = _scores([c for by_problem in counts.values() for c in by_problem.values()], n, ks)
    return {"benchmarks": benchmarks, "suite": suite}


def _scores(correct: list[int], n: int, ks: list[int]) -> dict:
    if not correct:
        raise ValueError("cannot score a benchmark without problems")
    scores = {"num_problems": len(correct), "mean@n": math.fsum(correct) / (n * len(correct))}
    for k in ks:
        scores[f"pass@{k}"] = math.fsum(pass_at_k(n, c, k) for c in correct) / len(correct)
    return scores
