"""The pairwise table: every pair of methods at the end of the run, with paired intervals and verdicts."""

from ggpo_offline.compare.counts import SELECTED
from ggpo_offline.compare.paired import At, Scores
from ggpo_offline.compare.tables import csv_row, display, verdict


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
    probability of improvement and verdict. Empty with one method."""
    if len(methods) < 2:
        return [], []
    counts = scores.counts
    lines = [
        "### Pairwise differences in mean@n (points), paired by seed and problem",
        "",
        "| at | A − B | difference [95 % CI] | P(A > B) | verdict |",
        "|---|---|---:|---:|---|",
    ]
    rows = []
    for at, label in end_places(scores):
        metric = f"mean@{counts.n[at.split]}"
        updates = {m: counts.checkpoints(m, at.checkpoint) for m in methods}
        for i, a in enumerate(methods):
            for b in methods[i + 1 :]:
                interval, chance = scores.difference(a, b, at), scores.improvement(a, b, at)
                lines.append(
                    f"| {label} | {display(a)} − {display(b)} | {interval.text()} | {chance:.2f} |"
                    f" {verdict(interval)} |"
                )
                update = " ".join(map(str, updates[a])) + " − " + " ".join(map(str, updates[b]))
                row = csv_row("pairwise", at, a, metric, versus=b, interval=interval, update=update)
                rows.append(row | {"p_improvement": round(chance, 6)})
    lines += [
        "",
        "Difference: the mean of A − B over seeds and problems; 95 % CI: crossed bootstrap over seeds and"
        " problems; P(A > B): the probability that A scores higher than B on a random problem for a random"
        " pair of seeds, ties counted half; resolved: the interval excludes 0.",
        "",
    ]
    return lines, rows
