"""`ggpo regimes-report`: the corrections under the conditions they were made for (docs/regimes/) — one
compare per condition (the control, a mismatch dose, a lag, both), each method against no correction (the
baseline) within its condition, one Holm family per condition ("does any correction beat none under C?");
each condition's measured mismatch and lag, and each method's ESS and masked share there; read from the
compares' committed files alone (counts.json and diagnostics.csv), not their runs."""

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ggpo_offline.compare import render, stats
from ggpo_offline.compare.blocks import Cell, Prose, Section, Table, number, prose
from ggpo_offline.compare.config import RegimesConfig
from ggpo_offline.compare.counts import COUNTS_FILE, SELECTED, Counts
from ggpo_offline.compare.ladder import points, seed_matrix
from ggpo_offline.compare.render import ReportData
from ggpo_offline.compare.report import DIAGNOSTICS_FILE
from ggpo_offline.compare.score_tables import display
from ggpo_offline.compare.stats import Verdict
from ggpo_offline.core.errors import UserError, read_versioned, write_versioned
from ggpo_offline.train.metric_names import AGE, MISMATCH_ESS, MISMATCH_K3, SAMPLER_METRICS, UPDATE

REGIMES_FILE = "regimes.json"
REGIMES_FORMAT = "ggpo-offline regimes 2"
MASKED = "correction/masked_frac"
MEASURED = ("sampler/abs_log_ratio", "sampler/k3", "sampler/ess", "sampler/outside")
"""The condition's mismatch as its runs measured it at update 0, in the order the report shows it."""


@dataclass(frozen=True)
class Condition:
    """One condition's compare: its name, counts and its runs' diagnostics per update."""

    name: str
    folder: Path
    counts: Counts
    diagnostics: pl.DataFrame

    @classmethod
    def read(cls, item: str) -> "Condition":
        name, given, folder = item.partition("=")
        if not given or not name or not folder:
            raise UserError(f"--conditions: {item!r} is not NAME=FOLDER")
        folder = Path(folder)
        for file in (COUNTS_FILE, DIAGNOSTICS_FILE):
            if not (folder / file).is_file():
                raise UserError(f"{folder} has no {file}: give the folder of a finished ggpo compare")
        counts = Counts.read(folder / COUNTS_FILE)
        rows = pl.read_csv(folder / DIAGNOSTICS_FILE, infer_schema_length=None)
        counted = pl.col("method").is_in(list(counts.methods)) & pl.col("seed").is_in(list(counts.seeds))
        return cls(name, folder, counts, rows.filter(counted))

    def mean(self, column: str, rows: pl.DataFrame | None = None) -> float | None:
        """The mean of a diagnostics column over ``rows`` (default all); None where no run logged it."""
        rows = self.diagnostics if rows is None else rows
        return rows[column].cast(pl.Float64).mean() if column in rows.columns else None


@dataclass(frozen=True)
class Versus:
    """A method's test mean@n (points) under a condition and its paired difference from the baseline's."""

    mean: float
    difference: Verdict

    @property
    def better(self) -> bool:
        return self.difference.resolved and self.difference.mean > 0


@dataclass(frozen=True)
class Measured:
    """One condition's numbers: its folder, its mismatch and lag (`measured`), the baseline's test
    mean@n, each other method against it (one Holm family) and each method's ESS and masked share."""

    folder: str
    measured: dict[str, float]
    baseline_mean: float
    against_baseline: dict[str, Versus]
    diagnostics: dict[str, dict[str, float]]


@dataclass(frozen=True)
class Regimes:
    """regimes.json: every number of the report, from which its README's tables are rendered alone."""

    seeds: list[int]
    baseline: str
    methods: list[str]
    """The first condition's methods, in its order."""
    conditions: dict[str, Measured]

    def write(self, folder: Path) -> None:
        write_versioned(self, REGIMES_FORMAT, folder / REGIMES_FILE)

    @classmethod
    def read(cls, folder: Path) -> "Regimes":
        """The folder's regimes.json; UserError in one line where it has none or another format."""
        missing = f"{folder}: no {REGIMES_FILE}, the numbers its report.json's tables come from"
        data = read_versioned(folder / REGIMES_FILE, (REGIMES_FORMAT,), missing)
        conditions = {}
        for name, found in data["conditions"].items():
            versus = {
                m: Versus(v["mean"], Verdict(**v["difference"])) for m, v in found["against_baseline"].items()
            }
            conditions[name] = Measured(**found | {"against_baseline": versus})
        return cls(data["seeds"], data["baseline"], data["methods"], conditions)


def regimes_report(config: RegimesConfig) -> Path:
    """Write the report's regimes.json (every number), report.json (what it read) and README.md into
    ``config.out``."""
    conditions = [Condition.read(item) for item in config.conditions]
    missing = [c.name for c in conditions if config.baseline not in c.counts.methods]
    if missing:
        raise UserError(f"--baseline {config.baseline} was not trained under {', '.join(missing)}")
    seeds = [s for s in conditions[0].counts.seeds if all(s in c.counts.seeds for c in conditions)]
    if not seeds:
        raise UserError("the conditions' compares share no seed")
    found = {}
    for c in conditions:
        baseline_mean, versus = against_baseline(c, config.baseline, seeds)
        found[c.name] = Measured(
            str(c.folder), measured(c, config.baseline), baseline_mean, versus, method_diagnostics(c)
        )
    regimes = Regimes(seeds, config.baseline, list(conditions[0].counts.methods), found)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    regimes.write(out)
    render.write_readme(out, ReportData("regimes", ()), regimes_sections(regimes))
    return out


def measured(condition: Condition, baseline: str) -> dict[str, float]:
    """The condition's mismatch at update 0 (`SAMPLER_METRICS`, the same for every run on its pool); the
    K3 that ``baseline`` trained on ("trained_k3": `MISMATCH_K3`, π_θ before each step against the behavior
    log-probs, so the sampler's difference and the samples' staleness together), over every update of its
    runs; and the mean and greatest age (`AGE`) over every update of every run."""
    first = condition.diagnostics.filter(pl.col(UPDATE) == 0)
    found = {name: condition.mean(name, first) for name in SAMPLER_METRICS}
    trained = condition.diagnostics.filter(pl.col("method") == baseline)
    found["trained_k3"] = condition.mean(MISMATCH_K3, trained)
    if AGE in condition.diagnostics.columns:
        ages = condition.diagnostics[AGE].cast(pl.Float64)
        found |= {"age_mean": ages.mean(), "age_max": ages.max()}
    return {name: value for name, value in found.items() if value is not None}


def against_baseline(
    condition: Condition, baseline: str, seeds: list[int]
) -> tuple[float, dict[str, Versus]]:
    """The baseline's test mean@n at the selected checkpoint, and each other method's with its difference
    from the baseline's (paired by seed and problem): the condition's methods are one Holm family."""
    counts, n = condition.counts, condition.counts.n["test"]
    base = seed_matrix(counts, baseline, "test", SELECTED, seeds)
    methods = [m for m in counts.methods if m != baseline]
    matrices = [seed_matrix(counts, m, "test", SELECTED, seeds) for m in methods]
    judged = stats.judge([stats.difference(matrix, base, n) for matrix in matrices])
    versus = {
        m: Versus(points(matrix, n), j.kept()) for m, matrix, j in zip(methods, matrices, judged, strict=True)
    }
    return points(base, n), versus


def method_diagnostics(condition: Condition) -> dict[str, dict[str, float]]:
    """Per method, its sequence ESS and, for a correction that masks, its masked share of tokens, averaged
    over every update of every run."""
    found = {}
    for method in condition.counts.methods:
        rows = condition.diagnostics.filter(pl.col("method") == method)
        means = {"ess": condition.mean(MISMATCH_ESS, rows), "masked": condition.mean(MASKED, rows)}
        found[method] = {name: value for name, value in means.items() if value is not None}
    return found


def _heading(regimes: Regimes) -> Section:
    baseline = display(regimes.baseline)
    text = (
        f"One compare per condition; every method against {baseline}, which corrects nothing, on test at the"
        f" checkpoint selected on validation. Seeds {', '.join(map(str, regimes.seeds))}, paired by seed and"
        " problem; t on seeds − 1 df, **one Holm family per condition** (`compare/stats.py`)."
    )
    return Section("heading", "# The corrections under the conditions they were made for", (prose(text),))


def regimes_sections(regimes: Regimes) -> list[Section]:
    """The whole README, heading and tables, from regimes.json alone (its report.json holds no section)."""
    baseline, by = display(regimes.baseline), regimes.conditions
    against = f"## Each method against {baseline} (test, selected checkpoint; each condition one family)"
    note = "Every number: `regimes.json`; each condition's own report is its compare's README."
    return [
        _heading(regimes),
        Section(
            "conditions", "## The conditions, as their runs measured them", (_conditions_table(by, baseline),)
        ),
        Section(
            "against baseline",
            against,
            (_against_table(regimes.methods, baseline, by), _beat_lines(baseline, by)),
        ),
        Section(
            "diagnostics",
            "## Sequence ESS and masked share of tokens, by condition (every update of every run)",
            (_diagnostics_table(regimes.methods, by), prose(note)),
        ),
    ]


def _conditions_table(by: dict[str, Measured], baseline: str) -> Table:
    """The sampler's mismatch at update 0, the K3 the baseline trained on, the samples' mean age."""
    header = ("condition", "mean |Δ log π|", "K3", "sequence ESS", "ratios outside [0.5, 2]")
    header += (f"K3 {baseline} trained on", "mean age")
    rows = []
    for name, condition in by.items():
        m = condition.measured
        cells = [number("{:.3g}", m[k]) if k in m else "—" for k in (*MEASURED, "trained_k3")]
        cells[3] = number("{:.2%}", m["sampler/outside"]) if "sampler/outside" in m else "—"
        age = number("{:.2f}", m["age_mean"]) if "age_mean" in m else "—"
        rows.append((f"{name} (`{condition.folder}`)", *cells, age))
    return Table(header, tuple(rows), "l" + "r" * (len(header) - 1))


def _against_table(methods: list[str], baseline: str, by: dict[str, Measured]) -> Table:
    rows = [(baseline, *(number("{:.2f}", c.baseline_mean) for c in by.values()))]
    for method in methods:
        cells = [c.against_baseline.get(method) for c in by.values()]
        if all(cell is None for cell in cells):
            continue
        shown = [
            "—" if c is None else number("{:.2f}", c.mean).then(c.difference.number(), " (", ")")
            for c in cells
        ]
        rows.append((display(method), *shown))
    return Table(("method", *by), tuple(rows), "l" + "r" * len(by))


def _beat_lines(baseline: str, by: dict[str, Measured]) -> Prose:
    """Per condition, the methods resolved above the baseline, or that none is."""
    lines = []
    for name, condition in by.items():
        better = [
            f"{display(m)} ({v.difference.mean:+.2f})"
            for m, v in condition.against_baseline.items()
            if v.better
        ]
        lines.append(f"- {name}: {', '.join(better) or 'none'} resolved above {baseline}")
    return prose(*lines)


def _diagnostics_table(methods: list[str], by: dict[str, Measured]) -> Table:
    rows = []
    for method in methods:
        cells: list[Cell] = []
        for condition in by.values():
            d = condition.diagnostics.get(method, {})
            if "ess" not in d:
                cells.append("—" + (f" / {d['masked']:.2%}" if "masked" in d else ""))
            elif "masked" in d:
                cells.append(number("{:.3f} / {:.2%}", d["ess"], d["masked"]))
            else:
                cells.append(number("{:.3f}", d["ess"]))
        rows.append((display(method), *cells))
    return Table(("method (ESS / masked)", *by), tuple(rows), "l" + "r" * len(by))
