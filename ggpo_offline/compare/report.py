"""A comparison's report: finished runs in; counts.json, table.md, table.csv, ceilings.md and PNG figures
out."""

import csv
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ggpo_offline.compare.against_ceilings import CEILINGS_FILE, ceilings_section
from ggpo_offline.compare.blocks import Block, markdown_text
from ggpo_offline.compare.claims import Claims
from ggpo_offline.compare.counts import COUNTS_FILE, Counts
from ggpo_offline.compare.figures import FIGURES, write_figures
from ggpo_offline.compare.finished_runs import RunRecord, check_data_plans, load_run
from ggpo_offline.compare.frontier import frontier_section
from ggpo_offline.compare.score_tables import (
    CSV_FIELDS,
    accuracy_section,
    end_section,
    ends,
    headline,
    pairwise_section,
    table5_section,
)
from ggpo_offline.compare.scores import Scores
from ggpo_offline.compare.variance import variance_section
from ggpo_offline.core.errors import replace_text, replacing
from ggpo_offline.train.metric_names import (
    AGE_METRICS,
    BY_AGE,
    CHECKPOINT_METRICS,
    GRAD_NORM,
    MISMATCH_DRIFT,
    MISMATCH_ESS,
    MISMATCH_ESS_BLOCK,
    MISMATCH_K3,
    POLICY_ENTROPY,
    REF_LOG_RATIO,
    RESPONSE_LENGTH,
    ROUND_INDEX,
    ROUND_METRICS,
    SAMPLER_METRICS,
    UPDATE,
)

STATISTICS = (
    "Every difference between two methods is paired: all methods are evaluated on the same problems with the"
    " same seeds, so A − B is taken problem by problem within each seed. A training run (seed) is the unit"
    " that varies between runs of a learner, and problems are the second sampled unit: the 95 % interval is"
    " Student's t on seeds − 1 degrees of freedom around the two-way ANOVA standard error (runs, problems,"
    " their interaction and sampling), which simulations with runs that differ show calibrated for 2 to 10"
    " seeds (`ggpo_offline/compare/stats.py` says why, and what was rejected; `tests/test_stats.py` is the"
    " test). Comparisons made together form a **family** (the pairs at one place, the marks of a row or"
    " column, each claim's intervals, the methods against a ceiling), and each family's p-values are"
    " adjusted by Holm's step-down. A difference is **resolved** when its Holm-adjusted p is below 0.05,"
    " **not resolved** otherwise (the data cannot tell, which is no evidence of equality), and **too few"
    " seeds** with one seed (its interval, over problems only, describes those two runs, not the learners)."
    " For a pair not resolved, the report gives the minimum detectable difference at the seeds used and the"
    " seeds that would resolve the observed difference with 80 % power; the variance table shows which of"
    " seeds, problems or samples would narrow the intervals most. P(A > B) is the probability of improvement"
    " (Agarwal et al. 2021): the chance that A scores higher than B on a random problem for a random pair of"
    " seeds, ties counted half. Training evaluates on the validation split only, and each run's checkpoint"
    " is selected there (best validation mean@n, the earliest among equals); the test split is evaluated"
    " once per run, at the end, on the selected and on the final checkpoint."
)
"""The README's Statistics paragraph: what the report's intervals, verdicts and splits mean."""

DIAGNOSTICS_FILE = "diagnostics.csv"
DIAGNOSTICS = (
    MISMATCH_DRIFT, MISMATCH_K3, MISMATCH_ESS, MISMATCH_ESS_BLOCK,
    REF_LOG_RATIO, POLICY_ENTROPY, GRAD_NORM, RESPONSE_LENGTH,
)  # fmt: skip
"""The training diagnostics diagnostics.csv keeps for every run and update (SPEC.md "Diagnostics")."""
CORRECTION_DIAGNOSTICS = tuple(
    f"correction/{name}"
    for name in ("weight_mean", "masked_frac", "truncated_frac", "masked_seq_frac", "none_kept")
)
"""A framework preset's share of tokens and responses its correction masks or truncates, its mean weight, and
whether its rejections kept no token of the minibatch: columns of diagnostics.csv when a run logged them
(`ggpo_offline.train.losses.composed`)."""
ROUND_DIAGNOSTICS = (ROUND_INDEX, *ROUND_METRICS)
"""A round's mismatch, entropy and length, logged at its first update by a run trained with --sync-every
(`ggpo_offline.train.sync`): columns of diagnostics.csv when a run logged them."""
SYNC_EVERY = "sync_every"
"""The setting a synchronised run's every row of diagnostics.csv carries: the ladder reads its N there."""

__all__ = [
    "DIAGNOSTICS_FILE",
    "FIGURES",
    "SYNC_EVERY",
    "Counts",
    "Report",
    "STATISTICS",
    "RunRecord",
    "check_data_plans",
    "compute_report",
    "load_run",
    "write_report",
    "write_tables",
]


@dataclass(frozen=True)
class Report:
    """A comparison's report, computed once from its counts: its files, the README and the terminal summary
    are each rendered from it, none read back from disk."""

    counts: Counts
    tables: tuple[Block, ...]
    """table.md: validation accuracy, end-of-run scores, pairwise differences, variance, Table 5, claims."""
    rows: tuple[dict, ...]
    """table.csv's rows (columns: ``tables.CSV_FIELDS``), every number of ``tables``."""
    ceilings: tuple[Block, ...] = ()
    """ceilings.md: each method against the pool model's ceilings of selection; none without a styles
    report (``--ceilings``) or arith test problems, and then the report has no such file."""

    @property
    def table_md(self) -> str:
        return markdown_text(self.tables)

    def write_tables(self, out: Path) -> None:
        replace_text(out / "table.md", self.table_md)
        with replacing(out / "table.csv") as tmp, tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(self.rows)

    def write(self, out: Path) -> None:
        """table.md, table.csv and ceilings.md, which is removed when empty so that a report never shows
        another comparison's."""
        self.write_tables(out)
        if self.ceilings:
            replace_text(out / CEILINGS_FILE, markdown_text(self.ceilings))
        else:
            (out / CEILINGS_FILE).unlink(missing_ok=True)


def compute_report(counts: Counts, styles: dict | None = None) -> Report:
    """The tables from the counts alone (so counts.json reproduces them) and, given ``styles`` (a
    ``ggpo measure-styles --json`` report of the pool's model), the methods against its ceilings."""
    scores, methods = Scores(counts), list(counts.methods)
    sections = [accuracy_section(scores, methods, scope) for scope in counts.scopes("validation")]
    sections.append(frontier_section(scores, methods))
    for end, title in ends(scores):
        sections += [
            end_section(scores, methods, replace(end, scope=s), title) for s in counts.scopes(end.split)
        ]
    sections += [
        pairwise_section(scores, methods),
        variance_section(scores, methods),
        table5_section(scores, methods, headline(scores, "validation")),
        Claims(scores, methods).section(),
    ]
    tables = tuple(block for blocks, _ in sections for block in blocks)
    rows = tuple(row for _, rows in sections for row in rows)
    ceilings = () if styles is None else tuple(ceilings_section(scores, methods, styles))
    return Report(counts, tables, rows, ceilings)


def write_report(
    records: list[RunRecord], methods: list[str], seeds: list[int], out: Path, styles: dict | None = None
) -> Report:
    """counts.json and diagnostics.csv, then the report computed from the counts (`compute_report`) and the
    figures, into ``out``."""
    counts = Counts.from_records(records, methods, seeds)
    counts.write(out / COUNTS_FILE)
    write_diagnostics(records, out / DIAGNOSTICS_FILE)
    report = compute_report(counts, styles)
    report.write(out)
    write_figures(records, Scores(counts), methods, out)
    return report


def write_diagnostics(records: list[RunRecord], path: Path, settings: tuple[str, ...] = ()) -> None:
    """Every run's training diagnostics per update, one row each (empty where a run logged none): the raw
    data of the figures' diagnostic panels and of the ESS and drift the reports quote; at evaluated
    checkpoints, the drift from π0 on the probe and what the policy generated (`CHECKPOINT_METRICS`), at a
    round's first update its diagnostics (`ROUND_DIAGNOSTICS`), at update 0 the pool's sampler against the
    learner (`SAMPLER_METRICS`), each update's ages (`AGE_METRICS`) and, with mixed ages, its age histogram
    and K3 by age (`BY_AGE`), where the runs logged them.
    ``settings`` names run settings written beside method and seed on every row (a sweep's ``lr``), and
    runs trained with --sync-every add theirs (`SYNC_EVERY`), so that the file alone is the data of the
    staleness ladder (`ggpo ladder-report`)."""
    if any(record.settings.sync_every is not None for record in records):
        settings = (*settings, SYNC_EVERY)
    logged = {name for record in records for row in record.metrics for name in row}
    optional = CORRECTION_DIAGNOSTICS + CHECKPOINT_METRICS + ROUND_DIAGNOSTICS + SAMPLER_METRICS + AGE_METRICS
    by_age = tuple(
        name
        for metric in BY_AGE
        for name in sorted((n for n in logged if n.startswith(metric(""))), key=lambda n: _age_of(n, metric))
    )
    columns = DIAGNOSTICS + tuple(name for name in optional if name in logged) + by_age
    with replacing(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("method", "seed", *settings, "update", *columns))
        for record in records:
            chosen = list(record.settings.only(settings).values())
            for row in record.metrics:
                values = (row.get(name, "") for name in columns)
                writer.writerow((record.method, record.seed, *chosen, row[UPDATE], *values))


def _age_of(name: str, metric: Callable[[int | str], str]) -> int:
    """The age a ``metric`` column (one of `BY_AGE`) is of."""
    return int(name.removeprefix(metric("")))


def write_tables(counts: Counts, out: Path) -> str:
    """table.md and table.csv into ``out``, from the counts alone (so counts.json reproduces them); returns
    the markdown."""
    report = compute_report(counts)
    report.write_tables(out)
    return report.table_md
