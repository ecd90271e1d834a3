"""The pairwise table: every pair of methods at the end of the run, with paired intervals and verdicts."""

from ggpo_offline.compare.counts import SELECTED
from ggpo_offline.compare.paired import At, Scores
from ggpo_offline.compare.tables import csv_row, display
from ggpo_offline.core import markdown


def headline(scores: Scores, split: str) -> str:
    """The scope findings are read on: the suite when a split has several benchmarks, else its one."""
    return scores.counts.scopes(split)[-1]


def end_places(scores: Scores) -> list[tuple[At, str]]:
    """The last validation update, then the selected and final checkpoints on test when tested."""
    counts = scores.counts
    last = counts.final("validation")
    places = [(At("validation", headline(scores, "validation"), last), f"validation, update {last}")]
    if "test" in counts.splits:
        scope, final = headline(scores, "test"), counts.final("test")
        places += [
            (At("test", scope, SELECTED), "test, selected checkpoint"),
            (At("test", scope, final), f"test, final checkpoint (update {final})"),
        ]
    return places


def pairwise_section(scores: Scores, methods: list[str]) -> tuple[list[str], list[dict]]:
    """A − B for every pair (A listed first) at each end place: mean difference, 95 % paired interval,
    Holm-adjusted p over the place's pairs, probability of improvement, verdict and, for a pair not
    resolved, what it would take. Empty with one method."""
    if len(methods) < 2:
        return [], []
    counts = scores.counts
    size = len(methods) * (len(methods) - 1) // 2
    table_rows, rows = [], []
    for at, label in end_places(scores):
        metric = f"mean@{counts.n[at.split]}"
        updates = {m: counts.checkpoints(m, at.checkpoint) for m in methods}
        for (a, b), judged in scores.pairs(methods, at).items():
            interval, chance = judged.interval, scores.improvement(a, b, at)
            needs = "" if judged.resolved else interval.needs()
            cells = [f"{display(a)} − {display(b)}", interval.text(), f"{judged.p_holm:.3f}", f"{chance:.2f}"]
            table_rows.append([label, *cells, judged.verdict, needs])
            update = " ".join(map(str, updates[a])) + " − " + " ".join(map(str, updates[b]))
            row = csv_row("pairwise", at, a, metric, versus=b, judged=judged, update=update)
            rows.append(row | {"p_improvement": round(chance, 6)})
    header = ["at", "A − B", "difference [95 % CI]", "p (Holm)", "P(A > B)", "verdict", "what it would take"]
    lines = [
        "### Pairwise differences in mean@n (points), paired by seed and problem",
        "",
        *markdown.table(header, table_rows, "llrrrll"),
        "",
        f"Difference: the mean of A − B over seeds and problems; 95 % CI: t on seeds − 1 degrees of freedom"
        f" (`compare/stats.py`); p (Holm): the two-sided p-value adjusted within the family of the {size}"
        " pairs at the same place; resolved: that p is below 0.05; P(A > B): the probability that A scores"
        " higher than B on a random problem for a random pair of seeds, ties counted half. What it would"
        " take: the minimum detectable difference (MDE, 80 % power, two-sided 5 %, one comparison) at these"
        " seeds, and the seeds that would resolve the observed difference with 80 % power at the same"
        " problems and samples, projected from the estimated variance components.",
        "",
    ]
    return lines, rows
