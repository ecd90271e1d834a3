"""How to spend a compare's compute: the seeds, evaluation problems and samples per problem that detect the
smallest difference within a budget, projected from a previous report's validation variance and run times.

A report's difference A − B has the variance (``stats.Components``, SPEC "Evaluation")

    var(D̄) = σ²_seed / S + σ²_problem / P + (σ²_interaction + σ²_sampling · n0 / n) / (S·P)

and a compare of M methods costs, in seconds of one core,

    S·M·(train + (E_val + E_test)·P·n·r) + E_base·P·n·r

with ``train`` a run's training time, ``r`` the evaluation seconds per sampled response, ``E_val`` and
``E_test`` a run's validation (after update 0) and test evaluations, and ``E_base`` the base model's, done
once per compare. Every one of these is read from a previous report: the components from its validation
split only (the split choices are made on; its test numbers are never looked at), the times from its runs'
profile.jsonl. Among problem and sample counts, each with the most seeds the budget buys, the allocation
with the smallest minimum detectable difference (80 % power, the median over the report's pairs) wins.
"""

import itertools
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from ggpo_offline.compare import stats
from ggpo_offline.compare.config import RUNS_FOLDER, CompareConfig
from ggpo_offline.compare.counts import COUNTS_FILE, Counts
from ggpo_offline.compare.score_tables import end_places
from ggpo_offline.compare.scores import Scores
from ggpo_offline.core.errors import UserError
from ggpo_offline.train.profile import TRAINING_PHASES
from ggpo_offline.train.training_presets import given_settings

PROBLEM_CHOICES = (32, 64, 128, 256, 512, 1024)
SAMPLE_CHOICES = (2, 4, 8, 16, 32)
"""From 2: one sample per problem shows no binomial spread; the next report could not split sampling off."""
MAX_SEEDS = 100


@dataclass(frozen=True)
class Costs:
    """What a previous compare's runs cost, seconds of one core."""

    train: float
    """A run's training: the mean over its runs of the TRAINING_PHASES."""
    per_response: float
    """Seconds per sampled response of the runs' own validation evaluations (weights loaded, sampled,
    scored): proportional, as measured (bench/results.md §8: 5 s for 256 responses, 19 s for 1,024)."""
    run_evaluations: float
    """A run's own evaluations: validation after update 0, plus test (final, and selected where other)."""
    base_evaluations: int
    """The base model's evaluations (validation and test), once per compare."""

    def seconds(self, runs: int, problems: int, samples: int) -> float:
        responses = problems * samples * (runs * self.run_evaluations + self.base_evaluations)
        return runs * self.train + responses * self.per_response

    def most_seeds(self, methods: int, problems: int, samples: int, budget_s: float) -> int:
        """The most seeds of ``methods`` runs each whose ``seconds`` fit ``budget_s`` (at most MAX_SEEDS)."""
        per_response = problems * samples * self.per_response
        runs = (budget_s - self.base_evaluations * per_response) / (
            self.train + self.run_evaluations * per_response
        )
        return min(MAX_SEEDS, math.floor(runs / methods))


@dataclass(frozen=True)
class Allocation:
    """One way to spend the budget: seeds × problems × samples, its cost and the difference it detects."""

    seeds: int
    problems: int
    samples: int
    seconds: float
    mde: float
    """The median over the report's pairs of the minimum detectable difference (points, one comparison)."""

    def text(self) -> str:
        return (
            f"{self.seeds} seeds x {self.problems} problems x {self.samples} samples: "
            f"{self.seconds / 60:.0f} core-minutes, MDE {self.mde:.1f} points"
        )


@dataclass(frozen=True)
class Evidence:
    """What a previous report says about its differences and its costs."""

    parts: tuple[stats.Components, ...]
    """The variance components of every pair of methods at the last validation update."""
    problems: int
    samples: int
    costs: Costs
    where: str
    """The report folder, for messages."""

    def mde(self, seeds: int, problems: int, samples: int) -> float:
        quantile = float(stats.power_quantile(seeds - 1))
        scale = samples / self.samples
        return quantile * statistics.median(math.sqrt(p.variance(seeds, problems, scale)) for p in self.parts)


def read_evidence(report_dir: Path) -> Evidence:
    """The validation variance components and run costs of the compare report in ``report_dir``."""
    counts_file = Path(report_dir) / COUNTS_FILE
    if not counts_file.is_file():
        raise UserError(f"--budget-from {report_dir} has no {COUNTS_FILE}; give a folder ggpo compare wrote")
    counts = Counts.read(counts_file)
    if len(counts.seeds) < stats.MIN_SEEDS or len(counts.methods) < 2:
        raise UserError(
            f"--budget-from {report_dir} compares {len(counts.methods)} method(s) x {len(counts.seeds)} "
            "seed(s); the variance between runs needs at least 2 methods and 2 seeds"
        )
    scores = Scores(counts)
    at = end_places(scores)[0][0]  # the last validation update: choices never look at test
    pairs = scores.pairs(list(counts.methods), at)
    problems = sum(len(ids) for ids in counts.prompts["validation"].values())
    costs = _read_costs(Path(report_dir), counts, problems)
    parts = tuple(judged.interval.parts for judged in pairs.values())
    return Evidence(parts, problems, counts.n["validation"], costs, str(report_dir))


def _read_costs(report_dir: Path, counts: Counts, problems: int) -> Costs:
    from ggpo_offline.train.run_folder import RunFolder
    from ggpo_offline.train.run_records import RunId

    profiles = {
        run: RunFolder(report_dir / RUNS_FOLDER / RunId(*run).folder_name).read_profile()
        for run in itertools.product(counts.methods, counts.seeds)
    }
    profiles = {run: phases for run, phases in profiles.items() if phases}
    if not profiles:
        raise UserError(
            f"--budget-from {report_dir}: no run recorded its times (runs/*/profile.jsonl); give a report "
            "whose runs this version trained"
        )
    train = statistics.fmean(
        sum(p.seconds for p in phases if p.phase in TRAINING_PHASES) for phases in profiles.values()
    )
    # A run's own evaluations: update 0 is the base model's, evaluated once per compare (the engine's start
    # included) and read from the evaluator's cache by every later run.
    evaluations = [p for phases in profiles.values() for p in phases if p.phase == "evaluate" and p.update]
    per_response = sum(p.seconds for p in evaluations) / (
        len(evaluations) * problems * counts.n["validation"]
    )
    final = counts.final("validation")
    own_validation = len([u for u in counts.updates("validation") if u > 0])
    own_tests = 0.0
    if "test" in counts.splits:
        own_tests = statistics.fmean(1 + (counts.selected.get(run, final) != final) for run in profiles)
    base = sum(counts.has_base(split) for split in counts.splits)
    return Costs(train, per_response, own_validation + own_tests, base)


def allocations(
    evidence: Evidence,
    methods: int,
    budget_s: float,
    problems: tuple[int, ...] = PROBLEM_CHOICES,
    samples: tuple[int, ...] = SAMPLE_CHOICES,
) -> list[Allocation]:
    """For every problems × samples choice, the most seeds (at least 2) that fit ``budget_s`` seconds of
    one core for ``methods`` methods; best (smallest MDE, then cheapest) first. Empty when none fits."""
    found = []
    for p in problems:
        for n in samples:
            seeds = evidence.costs.most_seeds(methods, p, n, budget_s)
            if seeds >= stats.MIN_SEEDS:
                cost = evidence.costs.seconds(seeds * methods, p, n)
                found.append(Allocation(seeds, p, n, cost, evidence.mde(seeds, p, n)))
    return sorted(found, key=lambda a: (a.mde, a.seconds))


def budgeted(config: CompareConfig) -> tuple[CompareConfig, list[Allocation]]:
    """``config`` with the seeds and evaluation sizes its budget buys best (`allocations`), and every
    allocation considered; ``config`` itself when it has no budget. Sizes the user gave stay fixed; seeds
    are the given ones first, then 1, 2, 3, ..."""
    if config.budget is None:
        return config, []
    evidence = read_evidence(config.budget_from)
    given = given_settings(config.config_file, config.settings)
    problem_choices = (given["eval_num_problems"],) if "eval_num_problems" in given else PROBLEM_CHOICES
    sample_choices = (given["eval_n"],) if "eval_n" in given else SAMPLE_CHOICES
    found = allocations(evidence, len(config.methods), 60 * config.budget, problem_choices, sample_choices)
    if not found:
        cheapest = min(
            evidence.costs.seconds(stats.MIN_SEEDS * len(config.methods), p, n)
            for p in problem_choices
            for n in sample_choices
        )
        raise UserError(
            f"--budget {config.budget:g} core-minutes does not buy 2 seeds of {len(config.methods)} methods; "
            f"the cheapest such compare costs {math.ceil(cheapest / 60)} (times from {evidence.where})"
        )
    best = found[0]
    sizes = {"eval_num_problems": best.problems, "test_num_problems": best.problems, "eval_n": best.samples}
    settings = {**{k: v for k, v in sizes.items() if k not in given}, **config.settings}
    seeds = list(config.seeds)
    seeds += [s for s in range(1, MAX_SEEDS + len(seeds) + 1) if s not in seeds]
    chosen = replace(
        config, seeds=tuple(seeds[: best.seeds]), settings=settings, budget=None, budget_from=None
    )
    return chosen, found
