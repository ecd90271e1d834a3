"""Scores from per-problem correct counts (SPEC "Evaluation"): unbiased pass@k and mean@n, as the typed
records an evaluation report holds."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

MEAN_KEY = "mean@n"
PASS_PREFIX = "pass@"


@dataclass(frozen=True)
class Scores:
    """mean@n and pass@k over a set of problems: a benchmark's, or the suite's (every benchmark's problems
    together). Stored as ``{"num_problems", "mean@n", "pass@<k>"...}``."""

    num_problems: int
    mean_at_n: float
    """mean@n: the fraction of the ``n`` samples per problem that are correct, averaged over problems."""
    pass_at_k: dict[int, float]
    """Unbiased pass@k for each reported k, ascending (pass@1 equals mean@n up to rounding)."""

    def to_dict(self) -> dict:
        return {
            "num_problems": self.num_problems,
            MEAN_KEY: self.mean_at_n,
            **{f"{PASS_PREFIX}{k}": value for k, value in self.pass_at_k.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Scores":
        return cls(**_score_fields(data))


@dataclass(frozen=True)
class BenchmarkScores(Scores):
    """One benchmark's scores, the per-problem counts they come from and the dataset they were read from."""

    counts: dict[str, int]
    """prompt id -> correct samples (of n), in the order the problems were evaluated."""
    dataset: dict | None = None
    """The dataset's description (spec, source, sha256, ...); None: not recorded (scores from counts alone,
    as `aggregate` gives them)."""
    skipped_long_prompts: int | None = None
    """Problems left out because their prompt leaves no room for the response; None: not recorded."""

    def to_dict(self) -> dict:
        recorded = {"dataset": self.dataset, "skipped_long_prompts": self.skipped_long_prompts}
        return {
            **super().to_dict(),
            "counts": dict(self.counts),
            **{key: value for key, value in recorded.items() if value is not None},
        }

    @classmethod
    def from_dict(cls, data: dict) -> "BenchmarkScores":
        return cls(
            **_score_fields(data),
            counts=dict(data["counts"]),
            dataset=data.get("dataset"),
            skipped_long_prompts=data.get("skipped_long_prompts"),
        )


def _score_fields(data: dict) -> dict:
    pass_at_k = {
        int(key.removeprefix(PASS_PREFIX)): v for key, v in data.items() if key.startswith(PASS_PREFIX)
    }
    return {"num_problems": data["num_problems"], "mean_at_n": data[MEAN_KEY], "pass_at_k": pass_at_k}


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


def aggregate(
    counts: dict[str, dict[str, int]], n: int, ks: Sequence[int]
) -> tuple[dict[str, BenchmarkScores], Scores]:
    """Benchmark and suite scores from per-problem correct counts ``{benchmark: {prompt_id: c}}``.

    A benchmark averages over its problems; the suite averages over the problems of all benchmarks
    together (problem-weighted: each problem counts once, so it is not the mean of benchmark means).
    Returns ``(benchmarks, suite)``: each benchmark's scores with its counts (no dataset recorded), and the
    suite's; pass@k for each reported k (`reported_ks`).
    """
    ks = reported_ks(ks, n)
    benchmarks = {
        name: BenchmarkScores(**_scores(list(by_problem.values()), n, ks), counts=dict(by_problem))
        for name, by_problem in counts.items()
    }
    suite = Scores(**_scores([c for by_problem in counts.values() for c in by_problem.values()], n, ks))
    return benchmarks, suite


def _scores(correct: list[int], n: int, ks: list[int]) -> dict:
    if not correct:
        raise ValueError("cannot score a benchmark without problems")
    return {
        "num_problems": len(correct),
        "mean_at_n": math.fsum(correct) / (n * len(correct)),
        "pass_at_k": {k: math.fsum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in ks},
    }
