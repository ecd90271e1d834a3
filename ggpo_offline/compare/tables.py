"""The report's score tables: validation accuracy per update, end-of-run scores, and the paper's Table 5."""

from dataclasses import dataclass

from ggpo_offline.compare import stats
from ggpo_offline.compare.counts import BASE, SELECTED, SUITE
from ggpo_offline.compare.paired import MEAN, At, Cell, Scores
from ggpo_offline.train.learners import learner

MARK = "†"
MARK_NOTE = (
    f"**Bold**: the highest mean in the {{where}}; {MARK}: not resolved below it (the 95 % paired interval of"
    " this method − the best includes 0); unmarked: resolved below the best."
)
CSV_FIELDS = (
    "table", "split", "benchmark", "checkpoint", "update", "method", "metric", "mean", "std", "seeds",
    "values", "versus", "difference", "low", "high", "p_improvement", "verdict",
)  # fmt: skip
"""table.csv's columns. A score row fills mean to values; a difference row (method − versus) fills versus to
verdict; a score row of a ranked table fills both, versus being the best method of its row or column."""


def display(method: str) -> str:
    return "base model" if method == BASE else learner(method).label


def rate_text(lr: float) -> str:
    """A learning rate as people write it: 3e-4, 1.5e-5."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def verdict(interval: stats.Interval) -> str:
    return "resolved" if interval.resolved else "not resolved"


def interval_verdict(interval: stats.Interval) -> str:
    """E.g. "+4.10 [+1.02, +7.31] resolved"."""
    return f"{interval.text()} {verdict(interval)}"


@dataclass(frozen=True)
class Ranked:
    """The best method at one place and every other method's paired difference from it (other − best)."""

    best: str
    below: dict[str, stats.Interval]

    def mark(self, method: str, text: str) -> str:
        if method == self.best:
            return f"**{text}**"
        return text if self.below[method].resolved else f"{text} {MARK}"


def rank(scores: Scores, methods: list[str], at: At, metric: str = MEAN) -> Ranked:
    """The highest seed mean (the first listed among equals) and the intervals of the others below it."""
    means = {method: scores.cell(method, at, metric).mean for method in methods}
    best = max(methods, key=lambda method: means[method])
    return Ranked(best, {m: scores.difference(m, best, at, metric=metric) for m in methods if m != best})


def csv_row(table: str, at: At, method: str, metric: str, **fields) -> dict:
    """One table.csv row: ``cell`` (a Cell), ``versus`` with ``interval`` and ``p_improvement`` optional."""
    cell, interval = fields.pop("cell", None), fields.pop("interval", None)
    row = dict.fromkeys(CSV_FIELDS, "")
    row |= {"table": table, "split": at.split, "benchmark": at.scope, "method": method, "metric": metric}
    row["checkpoint"] = at.checkpoint if isinstance(at.checkpoint, str) else "update"
    if cell is not None:
        std = "" if cell.std != cell.std else round(cell.std, 6)  # NaN with one seed
        row |= {"mean": round(cell.mean, 6), "std": std, "seeds": len(cell.values)}
        row["values"] = " ".join(f"{v:.6g}" for v in cell.values)
    if interval is not None:
        row |= {"difference": round(interval.mean, 6), "low": round(interval.low, 6)}
        row |= {"high": round(interval.high, 6), "verdict": verdict(interval)}
    return row | {key: value for key, value in fields.items() if value is not None}


def mde_line(scores: Scores, methods: list[str], at: At) -> str:
    """The minimum detectable difference at this evaluation size, over the methods' counts at ``at``."""
    counts = scores.counts
    n, seeds = counts.n[at.split], len(counts.seeds)
    problems = counts.matrix(methods[0], at.split, at.scope, at.checkpoint).shape[1]
    try:
        found = [
            stats.minimum_detectable_difference(counts.matrix(m, at.split, at.scope, at.checkpoint), n)
            for m in methods
        ]
    except ValueError as error:  # one seed of one sample: no noise estimate
        return f"Minimum detectable difference: not estimable ({error})."
    low, high = min(found), max(found)
    size = f"{problems} problems × {n} samples × {seeds} seed{'s' if seeds > 1 else ''}"
    span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"
    return (
        f"Minimum detectable difference at this size ({size}; 80 % power, two-sided 5 %): {span} points,"
        f" from the spread of each method's counts at {place(at)}."
    )


def place(at: At, updates: tuple[int, ...] = ()) -> str:
    """Where a score was read, in words."""
    if at.checkpoint == SELECTED:
        return "the selected checkpoint" + (f" (updates {', '.join(map(str, updates))})" if updates else "")
    return f"update {at.checkpoint}"


def _what(scope: str, split: str) -> str:
    return f"the problem-weighted {split} suite" if scope == SUITE else scope


def accuracy_section(scores: Scores, methods: list[str], scope: str) -> tuple[list[str], list[dict]]:
    """mean@n on validation at every evaluated update (the paper's Figure 4, left), ranked row by row."""
    counts = scores.counts
    n, seeds = counts.n["validation"], ", ".join(map(str, counts.seeds))
    lines = [
        f"### Validation accuracy: mean@{n} (%) on {_what(scope, 'validation')}, mean ± sample std over"
        f" seeds {seeds}",
        "",
        "| update | " + " | ".join(display(m) for m in methods) + " |",
        "|---:|" + "---:|" * len(methods),
    ]
    rows = []
    for update in counts.updates("validation"):
        at = At("validation", scope, update)
        ranked, cells = rank(scores, methods, at), {m: scores.cell(m, at) for m in methods}
        lines.append(f"| {update} | " + " | ".join(ranked.mark(m, cells[m].text()) for m in methods) + " |")
        rows += [_ranked_row("accuracy", at, m, f"mean@{n}", cells[m], ranked, update) for m in methods]
    final = At("validation", scope, counts.final("validation"))
    lines += ["", MARK_NOTE.format(where="row"), "", mde_line(scores, methods, final), ""]
    return lines, rows


def _ranked_row(table: str, at: At, method: str, metric: str, cell: Cell, ranked: Ranked, update) -> dict:
    other = {} if method == ranked.best else {"versus": ranked.best, "interval": ranked.below[method]}
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


def end_section(scores: Scores, methods: list[str], end: At, title: str) -> tuple[list[str], list[dict]]:
    """mean@n and pass@k per method at one end-of-run place, each column ranked; the base model and each
    run's gain over it (its seed's update 0) when the base model was evaluated on this split."""
    counts = scores.counts
    n, base = counts.n[end.split], counts.has_base(end.split)
    keys = [MEAN] + [f"pass@{k}" for k in counts.ks[end.split]]
    headers = [f"mean@{n}" if key == MEAN else key for key in keys] + ([f"gain in mean@{n}"] if base else [])
    lines = [
        f"### {title} on {_what(end.scope, end.split)} (%)",
        "",
        "| method | update | " + " | ".join(headers) + " |",
        "|---|---:|" + "---:|" * len(headers),
    ]
    ranked = {key: rank(scores, methods, end, key) for key in keys}
    base_at = At(end.split, end.scope, 0)
    rows = []
    for method in ([BASE] if base else []) + methods:
        at = base_at if method == BASE else end
        updates = counts.checkpoints(method, at.checkpoint)
        update = " ".join(map(str, updates)) if len(set(updates)) > 1 else str(updates[0])
        cells = {key: scores.cell(method, at, key) for key in keys}
        texts = [cells[k].text() if method == BASE else ranked[k].mark(method, cells[k].text()) for k in keys]
        if base:
            base_values = scores.cell(BASE, base_at).values
            gain = Cell(tuple(a - b for a, b in zip(cells[MEAN].values, base_values, strict=True)))
            texts.append(gain.text())
            rows.append(csv_row("end", at, method, f"gain in mean@{n}", cell=gain, update=update))
        lines.append(f"| {display(method)} | {update.replace(' ', ', ')} | " + " | ".join(texts) + " |")
        for key, header in zip(keys, headers, strict=False):
            if method == BASE:
                rows.append(csv_row("end", at, method, header, cell=cells[key], update=update))
            else:
                rows.append(_ranked_row("end", at, method, header, cells[key], ranked[key], update))
    if not base:
        lines += ["", f"The base model was not evaluated on {end.split}, so no gain over it is shown."]
    lines += [
        "",
        MARK_NOTE.format(where="column" + (" (the gain ranks as mean@n does)" if base else "")),
        "",
        mde_line(scores, methods, end),
        "",
    ]
    return lines, rows


def table5_section(scores: Scores, methods: list[str], scope: str) -> tuple[list[str], list[dict]]:
    """The paper's offline table: per method, validation mean@n at each evaluated update, then the peak,
    its update, the final value and the decline (peak − final) with its paired interval."""
    counts = scores.counts
    n, updates, final = counts.n["validation"], counts.updates("validation"), counts.final("validation")
    lines = [
        f"### The paper's Table 5 layout: validation mean@{n} (%) on {_what(scope, 'validation')}",
        "",
        "| method | " + " | ".join(map(str, updates)) + " | peak | at update | final | decline [95 % CI] |",
        "|---|" + "---:|" * (len(updates) + 4),
    ]
    rows = []
    for method in methods:
        peak = scores.peak(method, "validation", scope)
        decline = scores.difference(
            method, method, At("validation", scope, peak), At("validation", scope, final)
        )
        cells = [scores.cell(method, At("validation", scope, u)).text() for u in updates]
        peak_cell = scores.cell(method, At("validation", scope, peak)).text()
        final_cell = scores.cell(method, At("validation", scope, final)).text()
        lines.append(
            f"| {display(method)} | " + " | ".join(cells) + f" | {peak_cell} | {peak} | {final_cell} |"
            f" {decline.text()} |"
        )
        row = csv_row(
            "decline", At("validation", scope, "peak − final"), method, f"mean@{n}", interval=decline
        )
        rows.append(row | {"update": f"{peak} − {final}", "versus": method})
    lines += [
        "",
        f"Peak: the highest seed-mean over the {len(updates)} evaluations (the earliest among equals);"
        " decline: peak − final, paired by seed and problem. A maximum over evaluations is biased upward,"
        " and so is this decline; the test decline in the claims below (selected − final checkpoint, the"
        " selection made on validation) is not.",
        "",
    ]
    return lines, rows
