"""Accuracy against drift: validation scores set against each run's drift from π0, and every method compared
at drifts all of them reach (issue 39: learners compared where they stand, not only where they stop)."""

import math
import statistics

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import Block, Table, number, prose
from ggpo_offline.compare.claims import directional
from ggpo_offline.compare.score_tables import MARK_NOTE, csv_row, display, headline, rank, ranked_row
from ggpo_offline.compare.scores import At, Matched, Scores
from ggpo_offline.train.learners import learner

SHARES = (0.25, 0.5, 1.0)
"""The matched levels, as shares of the largest probe K3 every run reaches."""


def common_reach(scores: Scores, methods: list[str]) -> float:
    """The largest probe K3 that every run of ``methods`` reaches at one of its validation checkpoints."""
    counts = scores.counts
    return min(
        max(k3 for _, k3 in counts.probe_k3(method, seed)) for method in methods for seed in counts.seeds
    )


def matched_levels(scores: Scores, methods: list[str]) -> list[float]:
    """`SHARES` of `common_reach` (none when no run moves): exact, since a level rounded up for print could
    lie beyond a run's reach."""
    reach = common_reach(scores, methods)
    return sorted({share * reach for share in SHARES}) if reach > 0 else []


def frontier_section(scores: Scores, methods: list[str]) -> tuple[list[Block], list[dict]]:
    """Validation mean@n at matched probe K3 levels, ranked row by row as the accuracy table is; empty when
    the runs measured no drift (no probe) or none moved."""
    counts = scores.counts
    if not counts.probe:
        return [], []
    levels = matched_levels(scores, methods)
    if not levels:
        return [], []
    scope, n = headline(scores, "validation"), counts.n["validation"]
    metric = f"mean@{n}"
    table_rows, rows = [], []
    for level in levels:
        at = At("validation", scope, Matched(level))
        ranked, cells = rank(scores, methods, at), {m: scores.cell(m, at) for m in methods}
        table_rows.append((number("{:.3g}", level), *(ranked.mark(m, cells[m].number()) for m in methods)))
        rows += [ranked_row("matched_drift", at, m, metric, cells[m], ranked, "") for m in methods]
    blocks = [
        prose(
            f"### Accuracy at matched drift: validation {scope} mean@{n} (%) where each run's drift from π0"
            " reaches the same probe K3"
        ),
        prose(
            "Drift: probe K3, the token mean of exp(λ) − λ − 1 with λ = log π_θ − log π0 on a fixed probe of"
            " the pool's responses (its first mixed groups, teacher-forced; `--probe-groups`), measured at"
            " every validation checkpoint. A run's score at a level is interpolated linearly in K3 between"
            " the two checkpoints around the first one where its drift reaches that level, problem by"
            f" problem; levels are {', '.join(f'{share:g}' for share in SHARES)} of the largest K3 every run"
            f" reaches ({common_reach(scores, methods):.3g}). A method ahead at matched updates only because"
            " it moved further from π0 is not ahead here. The frontier is as fine as the evaluation"
            " schedule: a run whose first evaluation after update 0 is already beyond a level is read on a"
            " straight line from the base model there."
        ),
        Table(("probe K3", *map(display, methods)), tuple(table_rows), "r" * (1 + len(methods))),
        prose(MARK_NOTE.format(where="row", pairs=len(methods) * (len(methods) - 1) // 2)),
    ]
    claim_blocks, claim_rows = matched_claims(scores, methods, levels)
    return blocks + claim_blocks, rows + claim_rows


def matched_claims(scores: Scores, methods: list[str], levels: list[float]) -> tuple[list[Block], list[dict]]:
    """The paper's claims (a) and (d) read at matched drift instead of matched updates, each one Holm family
    with a verdict as in `claims`: (a) GGPO − each other method at every level; (d) GRPO+TIS − GRPO at the
    middle level (the paper's mid-training)."""
    scope, n = headline(scores, "validation"), scores.counts.n["validation"]
    lines, rows = [], []

    def judged(claim: str, pairs: list[tuple[str, str, float]]) -> list[stats.Judged]:
        places = [(a, b, At("validation", scope, Matched(level))) for a, b, level in pairs]
        family = stats.judge([scores.difference(a, b, at) for a, b, at in places])
        for (a, b, at), one in zip(places, family, strict=True):
            rows.append(csv_row(f"claim {claim}, matched drift", at, a, f"mean@{n}", versus=b, judged=one))
        return family

    others = [m for m in methods if m != "ggpo"]
    if "ggpo" in methods and others:
        pairs = [("ggpo", other, level) for level in levels for other in others]
        family = judged("a", pairs)
        listing = "; ".join(
            f"K3 {level:.3g} vs {display(other)} {one.interval.text()}"
            for (_, other, level), one in zip(pairs, family, strict=True)
        )
        lines.append(
            f"- (a) at matched drift, GGPO is the highest: **{directional(family)}** [{len(family)}] — GGPO −"
            f" each method: {listing}."
        )
    if "grpo" in methods and "grpo-tis" in methods:
        middle = levels[len(levels) // 2]
        (one,) = judged("d", [("grpo-tis", "grpo", middle)])
        lines.append(
            f"- (d) at matched drift, GRPO+TIS ≥ GRPO: at probe K3 {middle:.3g}, GRPO+TIS − GRPO"
            f" {one.interval.text()}, **{directional([one])}**."
        )
    if not lines:
        return [], rows
    return [
        prose("The paper's claims at matched drift (beside the matched-update ones below):"),
        prose(*lines),
    ], rows


def plot_frontier(ax, scores: Scores, methods: list[str]) -> None:
    """One curve per method: the seed means of validation mean@n against probe K3 at each evaluated update,
    ±1 std over seeds both ways."""
    counts = scores.counts
    scope = headline(scores, "validation")
    for method in methods:
        xs, ys, x_err, y_err = [], [], [], []
        for update in counts.updates("validation"):
            drifts = [dict(counts.probe_k3(method, seed))[update] for seed in counts.seeds]
            cell = scores.cell(method, At("validation", scope, update))
            xs.append(math.fsum(drifts) / len(drifts))
            ys.append(cell.mean)
            x_err.append(statistics.stdev(drifts) if len(drifts) > 1 else 0.0)
            y_err.append(0.0 if math.isnan(cell.std) else cell.std)
        style = learner(method).style
        ax.errorbar(
            xs, ys, xerr=x_err, yerr=y_err, marker="o", markersize=3, capsize=0, elinewidth=0.6,
            label=display(method), **style,
        )  # fmt: skip
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlim(left=0)  # K3 is never negative; a seed band can reach below 0
    ax.set_title(f"validation mean@{counts.n['validation']} (%) against drift")
    ax.set_xlabel("probe K3 to π0 (symlog)")
