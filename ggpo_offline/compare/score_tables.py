"""The report's score tables: validation accuracy per update, end-of-run scores, every pair of methods'
differences, and the paper's Table 5."""

import math
from dataclasses import dataclass, replace

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import Block, Number, Table, number, prose
from ggpo_offline.compare.counts import BASE, SELECTED, SUITE
from ggpo_offline.compare.scores import MEAN, At, Cell, Matched, Scores
from ggpo_offline.train.learners import learner

MARK = "†"
MARK_NOTE = (
    f"**Bold**: the highest mean in the {{where}}; {MARK}: not resolved below it (this method − the best,"
    " judged in the family of the {pairs} pairs of methods here, Holm); unmarked: resolved below the best."
)
CSV_FIELDS = (
    "table", "split", "benchmark", "checkpoint", "update", "method", "metric", "mean", "std", "seeds",
    "values", "versus", "difference", "low", "high", "p_value", "p_holm", "family", "mde", "seeds_needed",
    "p_improvement", "verdict",
)  # fmt: skip
"""table.csv's columns. A score row fills mean to values; a difference row (method − versus) fills versus to
verdict (p_holm: adjusted within a family of ``family`` comparisons; mde and seeds_needed: what it would
take, stats.Interval); a score row of a ranked table fills both, versus being the best of its row or
column."""


def display(method: str) -> str:
    return "base model" if method == BASE else learner(method).label


def rate_text(lr: float) -> str:
    """A learning rate as people write it: 3e-4, 1.5e-5."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


@dataclass(frozen=True)
class Ranked:
    """The best method at one place and every other method's paired difference from it (other − best),
    judged in the family of every pair there."""

    best: str
    below: dict[str, stats.Judged]

    def mark(self, method: str, score: Number) -> Number:
        if method == self.best:
            return score.within("**", "**")
        return score if self.below[method].resolved else score.within("", f" {MARK}")


def rank(scores: Scores, methods: list[str], at: At, metric: str = MEAN) -> Ranked:
    """The highest seed mean (the first listed among equals) and the others' intervals below it."""
    means = {method: scores.cell(method, at, metric).mean for method in methods}
    best = max(methods, key=lambda method: means[method])
    family = scores.pairs(methods, at, metric)
    below = {}
    for method in methods:
        if method != best:
            judged = family.get((method, best)) or family[(best, method)]  # p-values are symmetric
            below[method] = replace(judged, interval=scores.difference(method, best, at, metric=metric))
    return Ranked(best, below)


def csv_row(table: str, at: At, method: str, metric: str, **fields) -> dict:
    """One table.csv row: ``cell`` (a Cell), ``versus`` with ``judged`` (a stats.Judged) optional."""
    cell, judged = fields.pop("cell", None), fields.pop("judged", None)
    row = dict.fromkeys(CSV_FIELDS, "")
    row |= {"table": table, "split": at.split, "benchmark": at.scope, "method": method, "metric": metric}
    row["checkpoint"] = at.checkpoint if isinstance(at.checkpoint, str) else "update"
    if isinstance(at.checkpoint, Matched):
        row["checkpoint"] = f"probe_k3={at.checkpoint.level:.6g}"
    if cell is not None:
        std = "" if cell.std != cell.std else round(cell.std, 6)  # NaN with one seed
        row |= {"mean": round(cell.mean, 6), "std": std, "seeds": len(cell.values)}
        row["values"] = " ".join(f"{v:.6g}" for v in cell.values)
    if judged is not None:
        interval = judged.interval
        needed = interval.seeds_needed()
        row |= {"difference": round(interval.mean, 6), "low": round(interval.low, 6)}
        row |= {"high": round(interval.high, 6), "p_value": f"{interval.p_value:.4g}"}
        row |= {"p_holm": f"{judged.p_holm:.4g}", "family": judged.family, "mde": round(interval.mde, 6)}
        row |= {"seeds_needed": "" if needed is None else needed if math.isinf(needed) else int(needed)}
        row["verdict"] = judged.verdict
    return row | {key: value for key, value in fields.items() if value is not None}


def mde_line(scores: Scores, methods: list[str], at: At) -> list[Block]:
    """The range of the pairs' minimum detectable differences at ``at`` (their calibrated errors); none
    without a pair."""
    counts = scores.counts
    n, seeds = counts.n[at.split], len(counts.seeds)
    problems = counts.matrix(methods[0], at.split, at.scope, at.checkpoint).shape[1]
    size = f"{problems} problems × {n} samples × {seeds} seed{'s' if seeds > 1 else ''}"
    if seeds < stats.MIN_SEEDS:
        return [
            prose(
                f"Minimum detectable difference at this size ({size}): not estimable, one seed shows no run"
                " spread."
            )
        ]
    found = [judged.interval.mde for judged in scores.pairs(methods, at).values()]
    if not found:
        return []
    low, high = min(found), max(found)
    span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"
    return [
        prose(
            f"Minimum detectable difference of a pair at this size ({size}; t on {seeds - 1} df, 80 % power,"
            f" two-sided 5 % for one comparison): {span} points at {place(at)}."
        )
    ]


def place(at: At, updates: tuple[int, ...] = ()) -> str:
    """Where a score was read, in words."""
    if at.checkpoint == SELECTED:
        return "the selected checkpoint" + (f" (updates {', '.join(map(str, updates))})" if updates else "")
    return f"update {at.checkpoint}"


def _pairs(methods: list[str]) -> int:
    return len(methods) * (len(methods) - 1) // 2


def _what(scope: str, split: str) -> str:
    return f"the problem-weighted {split} suite" if scope == SUITE else scope


def accuracy_section(scores: Scores, methods: list[str], scope: str) -> tuple[list[Block], list[dict]]:
    """mean@n on validation at every evaluated update (the paper's Figure 4, left), ranked row by row."""
    counts = scores.counts
    n, seeds = counts.n["validation"], ", ".join(map(str, counts.seeds))
    table_rows, rows = [], []
    for update in counts.updates("validation"):
        at = At("validation", scope, update)
        ranked, cells = rank(scores, methods, at), {m: scores.cell(m, at) for m in methods}
        table_rows.append((number("{}", update), *(ranked.mark(m, cells[m].number()) for m in methods)))
        rows += [ranked_row("accuracy", at, m, f"mean@{n}", cells[m], ranked, update) for m in methods]
    final = At("validation", scope, counts.final("validation"))
    blocks = [
        prose(
            f"### Validation accuracy: mean@{n} (%) on {_what(scope, 'validation')}, mean ± sample std over"
            f" seeds {seeds}"
        ),
        Table(("update", *map(display, methods)), tuple(table_rows), "r" * (1 + len(methods))),
        prose(MARK_NOTE.format(where="row", pairs=_pairs(methods))),
        *mde_line(scores, methods, final),
    ]
    return blocks, rows


def ranked_row(table: str, at: At, method: str, metric: str, cell: Cell, ranked: Ranked, update) -> dict:
    other = {} if method == ranked.best else {"versus": ranked.best, "judged": ranked.below[method]}
    return csv_row(table, at, method, metric, cell=cell, update=update, **other)


def ends(scores: Scores) -> list[tuple[At, str]]:
    """The places the end-of-run table reports, each with its title (scope filled in by the caller)."""
    counts = scores.counts
    if "test" not in counts.splits:
        final = counts.final("validation")
        return [(At("validation", "", final), f"Validation at the final update {final} (no test evaluation)")]
    final = counts.final("test")
    return [
        (
            At("test", "", SELECTED),
            "Test at the selected checkpoint (best validation mean@n, earliest on ties)",
        ),
        (At("test", "", final), f"Test at the final checkpoint (update {final})"),
    ]


def end_section(scores: Scores, methods: list[str], end: At, title: str) -> tuple[list[Block], list[dict]]:
    """mean@n and pass@k per method at one end-of-run place, each column ranked; the base model and each
    run's gain over it (its seed's update 0) when the base model was evaluated on this split."""
    counts = scores.counts
    n, base = counts.n[end.split], counts.has_base(end.split)
    keys = [MEAN] + [f"pass@{k}" for k in counts.ks[end.split]]
    headers = [f"mean@{n}" if key == MEAN else key for key in keys] + ([f"gain in mean@{n}"] if base else [])
    ranked = {key: rank(scores, methods, end, key) for key in keys}
    base_at = At(end.split, end.scope, 0)
    table_rows, rows = [], []
    for method in ([BASE] if base else []) + methods:
        at = base_at if method == BASE else end
        updates = counts.checkpoints(method, at.checkpoint)
        update = " ".join(map(str, updates)) if len(set(updates)) > 1 else str(updates[0])
        cells = {key: scores.cell(method, at, key) for key in keys}
        texts = [
            cells[k].number() if method == BASE else ranked[k].mark(method, cells[k].number()) for k in keys
        ]
        if base:
            base_values = scores.cell(BASE, base_at).values
            gain = Cell(tuple(a - b for a, b in zip(cells[MEAN].values, base_values, strict=True)))
            texts.append(gain.number())
            rows.append(csv_row("end", at, method, f"gain in mean@{n}", cell=gain, update=update))
        table_rows.append((display(method), update.replace(" ", ", "), *texts))
        for key, header in zip(keys, headers, strict=False):
            if method == BASE:
                rows.append(csv_row("end", at, method, header, cell=cells[key], update=update))
            else:
                rows.append(ranked_row("end", at, method, header, cells[key], ranked[key], update))
    blocks = [
        prose(f"### {title} on {_what(end.scope, end.split)} (%)"),
        Table(("method", "update", *headers), tuple(table_rows), "lr" + "r" * len(headers)),
    ]
    if not base:
        blocks.append(prose(f"The base model was not evaluated on {end.split}, so no gain over it is shown."))
    where = "column" + (" (the gain ranks as mean@n does)" if base else "")
    blocks += [prose(MARK_NOTE.format(where=where, pairs=_pairs(methods))), *mde_line(scores, methods, end)]
    return blocks, rows


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


def pairwise_section(scores: Scores, methods: list[str]) -> tuple[list[Block], list[dict]]:
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
            cells = (interval.number(), number("{:.3f}", judged.p_holm), number("{:.2f}", chance))
            table_rows.append((label, f"{display(a)} − {display(b)}", *cells, judged.verdict, needs))
            update = " ".join(map(str, updates[a])) + " − " + " ".join(map(str, updates[b]))
            row = csv_row("pairwise", at, a, metric, versus=b, judged=judged, update=update)
            rows.append(row | {"p_improvement": round(chance, 6)})
    header = ["at", "A − B", "difference [95 % CI]", "p (Holm)", "P(A > B)", "verdict", "what it would take"]
    blocks = [
        prose("### Pairwise differences in mean@n (points), paired by seed and problem"),
        Table(tuple(header), tuple(table_rows), "llrrrll"),
        prose(
            "Difference: the mean of A − B over seeds and problems; 95 % CI: t on seeds − 1 degrees of"
            " freedom (`compare/stats.py`); p (Holm): the two-sided p-value adjusted within the family of"
            f" the {size} pairs at the same place; resolved: that p is below 0.05; P(A > B): the probability"
            " that A scores higher than B on a random problem for a random pair of seeds, ties counted half."
            " What it would take: the minimum detectable difference (MDE, 80 % power, two-sided 5 %, one"
            " comparison) at these seeds, and the seeds that would resolve the observed difference with 80 %"
            " power at the same problems and samples, projected from the estimated variance components."
        ),
    ]
    return blocks, rows


def validation_declines(
    scores: Scores, methods: list[str], scope: str
) -> tuple[dict[str, int], list[stats.Judged]]:
    """Each method's validation peak (update) and its decline peak − final, judged as one family."""
    final = scores.counts.final("validation")
    peaks = {method: scores.peak(method, "validation", scope) for method in methods}
    declines = [
        scores.difference(m, m, At("validation", scope, peaks[m]), At("validation", scope, final))
        for m in methods
    ]
    return peaks, stats.judge(declines)


def table5_section(scores: Scores, methods: list[str], scope: str) -> tuple[list[Block], list[dict]]:
    """The paper's offline table: per method, validation mean@n at each evaluated update, then the peak,
    its update, the final value and the decline (peak − final) with its paired interval."""
    counts = scores.counts
    n, updates, final = counts.n["validation"], counts.updates("validation"), counts.final("validation")
    peaks, declines = validation_declines(scores, methods, scope)
    table_rows, rows = [], []
    for method, decline in zip(methods, declines, strict=True):
        peak = peaks[method]
        cells = [scores.cell(method, At("validation", scope, u)).number() for u in updates]
        peak_cell = scores.cell(method, At("validation", scope, peak)).number()
        final_cell = scores.cell(method, At("validation", scope, final)).number()
        ends = (peak_cell, number("{}", peak), final_cell, decline.interval.number())
        table_rows.append((display(method), *cells, *ends))
        row = csv_row("decline", At("validation", scope, "peak − final"), method, f"mean@{n}", judged=decline)
        rows.append(row | {"update": f"{peak} − {final}", "versus": method})
    header = ("method", *map(str, updates), "peak", "at update", "final", "decline [95 % CI]")
    blocks = [
        prose(f"### The paper's Table 5 layout: validation mean@{n} (%) on {_what(scope, 'validation')}"),
        Table(header, tuple(table_rows), "l" + "r" * (len(updates) + 4)),
        prose(
            f"Peak: the highest seed-mean over the {len(updates)} evaluations (the earliest among equals);"
            " decline: peak − final, paired by seed and problem. A maximum over evaluations is biased"
            " upward, and so is this decline; the test decline in the claims below (selected − final"
            f" checkpoint, the selection made on validation) is not. table.csv judges the {len(methods)}"
            " declines as one family (Holm)."
        ),
    ]
    return blocks, rows
