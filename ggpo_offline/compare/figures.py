"""The report's figures: validation accuracy over updates and against drift, and one seed's training and
generation diagnostics (Figure 4 and beyond)."""

import math
from collections.abc import Callable
from pathlib import Path

from ggpo_offline.compare.finished_runs import RunRecord
from ggpo_offline.compare.frontier import plot_frontier
from ggpo_offline.compare.score_tables import display, headline
from ggpo_offline.compare.scores import At, Scores
from ggpo_offline.core.errors import replacing
from ggpo_offline.train.learners import learner
from ggpo_offline.train.metric_names import (
    GENERATED_PREFIX,
    GRAD_NORM,
    MISMATCH_DRIFT,
    MISMATCH_ESS_BLOCK,
    POLICY_ENTROPY,
    UPDATE,
)

FIGURES = ("figure.png", "accuracy.png", "log_ratio.png", "ess.png", "grad_norm.png", "entropy.png")
"""The figures of every report; runs that measured their drift from π0 and what they generated add
`CHECKPOINT_FIGURES`."""
CHECKPOINT_FIGURES = ("frontier.png", "novel_first_token.png", "generated_length.png")
PANELS_PER_ROW = 4


def _series(record: RunRecord, key: str) -> tuple[list[int], list[float]]:
    points = [(r[UPDATE], r[key]) for r in record.metrics if r.get(key) is not None]
    return [u for u, _ in points], [v for _, v in points]


def _plot_accuracy(ax, scores: Scores, methods: list[str]) -> None:
    counts = scores.counts
    scope, updates = headline(scores, "validation"), counts.updates("validation")
    for method in methods:
        cells = [scores.cell(method, At("validation", scope, u)) for u in updates]
        means = [c.mean for c in cells]
        stds = [0.0 if math.isnan(c.std) else c.std for c in cells]
        style = learner(method).style
        ax.plot(updates, means, marker="o", markersize=3, label=display(method), **style)
        low = [m - s for m, s in zip(means, stds, strict=True)]
        high = [m + s for m, s in zip(means, stds, strict=True)]
        ax.fill_between(updates, low, high, color=style["color"], alpha=0.18, linewidth=0)
    ax.set_title(f"validation {scope} mean@{counts.n['validation']} (%), ±1 std over seeds")
    ax.set_xlabel("optimizer updates")


def _plot_diagnostic(ax, records: list[RunRecord], key: str, title: str, log: bool) -> None:
    for record in records:
        updates, values = _series(record, key)
        if log:
            values = [max(v, 1e-12) for v in values]  # an exact 0 cannot sit on a log axis
        marker = "o" if len(values) <= 20 else None  # sparse series (block ESS): show where the points are
        style = learner(record.method).style
        ax.plot(
            updates,
            values,
            label=display(record.method),
            linewidth=1.2,
            marker=marker,
            markersize=3,
            **style,
        )
    if log:
        ax.set_yscale("log")
    ax.set_title(f"{title} (seed {records[0].seed})")
    ax.set_xlabel("optimizer updates")


def _panels(records: list[RunRecord], scores: Scores, methods: list[str]) -> list[tuple[str, Callable]]:
    """(file name, draw function on an Axes) for each panel: the paper's Figure 4, then the entropy and,
    for runs that logged them, the accuracy-against-drift frontier and what the policy generated."""
    first = [r for r in records if r.seed == scores.counts.seeds[0]]
    first.sort(key=lambda r: methods.index(r.method))
    logged = {name for record in first for row in record.metrics for name in row}
    novel, length = (f"{GENERATED_PREFIX}{name}" for name in ("novel_first_token", "mean_length"))
    checkpoint_panels = [
        ("frontier.png", lambda ax: plot_frontier(ax, scores, methods), bool(scores.counts.probe)),
        (
            "novel_first_token.png",
            lambda ax: _plot_diagnostic(ax, first, novel, "novel generated first tokens", log=False),
            novel in logged,
        ),  # fmt: skip
        (
            "generated_length.png",
            lambda ax: _plot_diagnostic(ax, first, length, "generated length (tokens)", log=False),
            length in logged,
        ),
    ]
    return [
        ("accuracy.png", lambda ax: _plot_accuracy(ax, scores, methods)),
        (
            "log_ratio.png",
            lambda ax: _plot_diagnostic(ax, first, MISMATCH_DRIFT, "token-mean |log π_θ/μ|", log=True),
        ),
        (
            "ess.png",
            lambda ax: _plot_diagnostic(ax, first, MISMATCH_ESS_BLOCK, "normalized sequence ESS", log=True),
        ),
        (
            "grad_norm.png",
            lambda ax: _plot_diagnostic(ax, first, GRAD_NORM, "gradient norm", log=False),
        ),
        (
            "entropy.png",
            lambda ax: _plot_diagnostic(ax, first, POLICY_ENTROPY, "token entropy (nats)", log=False),
        ),
        *((name, draw) for name, draw, shown in checkpoint_panels if shown),
    ]


def _save(figure, path: Path) -> None:
    # The name of the temporary file does not end in .png: the format is named.
    with replacing(path) as tmp:
        figure.savefig(tmp, dpi=120, format="png")


def write_figures(records: list[RunRecord], scores: Scores, methods: list[str], out: Path) -> list[Path]:
    """figure.png (every panel, `PANELS_PER_ROW` to a row) and one PNG per panel."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    panels = _panels(records, scores, methods)
    written = []
    columns = min(len(panels), PANELS_PER_ROW)
    grid = (math.ceil(len(panels) / columns), columns)
    size = (4.6 * columns, 3.8 * grid[0])
    figure, axes = plt.subplots(*grid, figsize=size, constrained_layout=True, squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    for ax, (_, draw) in zip(axes.flat, panels, strict=False):
        draw(ax)
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False)
    _save(figure, out / "figure.png")
    plt.close(figure)
    written.append(out / "figure.png")
    for name, draw in panels:
        figure, ax = plt.subplots(figsize=(5.2, 3.8), constrained_layout=True)
        draw(ax)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize="small")
        _save(figure, out / name)
        plt.close(figure)
        written.append(out / name)
    return written
