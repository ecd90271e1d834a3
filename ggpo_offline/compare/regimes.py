"""`ggpo regimes-report`: the corrections under the conditions they were made for (docs/regimes/) — one
compare per condition (the control, a mismatch dose, a lag, both), each method against no correction (the
baseline) within its condition, one Holm family per condition ("does any correction beat none under C?");
each condition's measured mismatch and lag, and each method's ESS and masked share there; read from the
compares' committed files alone (counts.json and diagnostics.csv), not their runs."""

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ggpo_offline.compare import stats
from ggpo_offline.compare.config import RegimesConfig
from ggpo_offline.compare.counts import COUNTS_FILE, SELECTED, Counts
from ggpo_offline.compare.ladder import points, seed_matrix
from ggpo_offline.compare.report import DIAGNOSTICS_FILE
from ggpo_offline.compare.tables import display
from ggpo_offline.core import markdown
from ggpo_offline.core.errors import UserError, replace_text, write_json
from ggpo_offline.train.metric_names import AGE, MISMATCH_ESS, MISMATCH_K3, SAMPLER_METRICS, UPDATE

README = "README.md"
REGIMES_FILE = "regimes.json"
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


def regimes_report(config: RegimesConfig) -> Path:
    """Write the report's README.md and regimes.json (every number in it) into ``config.out``."""
    conditions = [Condition.read(item) for item in config.conditions]
    missing = [c.name for c in conditions if config.baseline not in c.counts.methods]
    if missing:
        raise UserError(f"--baseline {config.baseline} was not trained under {', '.join(missing)}")
    seeds = [s for s in conditions[0].counts.seeds if all(s in c.counts.seeds for c in conditions)]
    if not seeds:
        raise UserError("the conditions' compares share no seed")
    data = {
        "seeds": seeds,
        "baseline": config.baseline,
        "conditions": {
            c.name: {
                "folder": str(c.folder),
                "measured": measured(c, config.baseline),
                "against_baseline": against_baseline(c, config.baseline, seeds),
                "diagnostics": method_diagnostics(c),
            }
            for c in conditions
        },
    }
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(data, out / REGIMES_FILE)
    replace_text(out / README, _readme(conditions, data))
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


def against_baseline(condition: Condition, baseline: str, seeds: list[int]) -> dict:
    """Each method's test mean@n at the selected checkpoint, and its difference from the baseline's
    (paired by seed and problem): the condition's methods are one Holm family."""
    counts, n = condition.counts, condition.counts.n["test"]
    base = seed_matrix(counts, baseline, "test", SELECTED, seeds)
    methods = [m for m in counts.methods if m != baseline]
    matrices = [seed_matrix(counts, m, "test", SELECTED, seeds) for m in methods]
    judged = stats.judge([stats.difference(matrix, base, n) for matrix in matrices])
    return {
        "baseline": points(base, n),
        "methods": {
            m: {
                "mean": points(matrix, n),
                "difference": j.text(),
                "better": j.resolved and j.interval.mean > 0,
            }
            for m, matrix, j in zip(methods, matrices, judged, strict=True)
        },
    }


def method_diagnostics(condition: Condition) -> dict[str, dict[str, float]]:
    """Per method, its sequence ESS and, for a correction that masks, its masked share of tokens, averaged
    over every update of every run."""
    found = {}
    for method in condition.counts.methods:
        rows = condition.diagnostics.filter(pl.col("method") == method)
        means = {"ess": condition.mean(MISMATCH_ESS, rows), "masked": condition.mean(MASKED, rows)}
        found[method] = {name: value for name, value in means.items() if value is not None}
    return found


def _readme(conditions: list[Condition], data: dict) -> str:
    baseline, by = display(data["baseline"]), data["conditions"]
    methods = list(conditions[0].counts.methods)
    lines = [
        "# The corrections under the conditions they were made for",
        "",
        f"One compare per condition; every method against {baseline}, which corrects nothing, on test at the"
        f" checkpoint selected on validation. Seeds {', '.join(map(str, data['seeds']))}, paired by seed and"
        " problem; t on seeds − 1 df, **one Holm family per condition** (`compare/stats.py`).",
        "",
        "## The conditions, as their runs measured them",
        "",
        *_conditions_table(by, baseline),
        "",
        f"## Each method against {baseline} (test, selected checkpoint; each condition one family)",
        "",
        *_against_table(methods, baseline, by),
        "",
        *_beat_lines(baseline, by),
        "",
        "## Sequence ESS and masked share of tokens, by condition (every update of every run)",
        "",
        *_diagnostics_table(methods, by),
        "",
        "Every number: `regimes.json`; each condition's own report is its compare's README.",
        "",
    ]
    return "\n".join(lines)


def _conditions_table(by: dict, baseline: str) -> list[str]:
    """The sampler's mismatch at update 0, the K3 the baseline trained on, the samples' mean age."""
    header = ["condition", "mean |Δ log π|", "K3", "sequence ESS", "ratios outside [0.5, 2]"]
    header += [f"K3 {baseline} trained on", "mean age"]
    rows = []
    for name, condition in by.items():
        m = condition["measured"]
        cells = [f"{m[k]:.3g}" if k in m else "—" for k in (*MEASURED, "trained_k3")]
        cells[3] = f"{m['sampler/outside']:.2%}" if "sampler/outside" in m else "—"
        rows.append(
            [f"{name} (`{condition['folder']}`)", *cells, f"{m['age_mean']:.2f}" if "age_mean" in m else "—"]
        )
    return markdown.table(header, rows, "l" + "r" * (len(header) - 1))


def _against_table(methods: list[str], baseline: str, by: dict) -> list[str]:
    rows = [[baseline, *(f"{c['against_baseline']['baseline']:.2f}" for c in by.values())]]
    for method in methods:
        cells = [c["against_baseline"]["methods"].get(method) for c in by.values()]
        if all(cell is None for cell in cells):
            continue
        rows.append(
            [display(method)]
            + ["—" if cell is None else f"{cell['mean']:.2f} ({cell['difference']})" for cell in cells]
        )
    return markdown.table(["method", *by], rows, "l" + "r" * len(by))


def _beat_lines(baseline: str, by: dict) -> list[str]:
    """Per condition, the methods resolved above the baseline, or that none is."""
    lines = []
    for name, condition in by.items():
        better = [
            f"{display(m)} ({v['difference'].split(' [')[0]})"
            for m, v in condition["against_baseline"]["methods"].items()
            if v["better"]
        ]
        lines.append(f"- {name}: {', '.join(better) or 'none'} resolved above {baseline}")
    return lines


def _diagnostics_table(methods: list[str], by: dict) -> list[str]:
    rows = []
    for method in methods:
        cells = []
        for condition in by.values():
            d = condition["diagnostics"].get(method, {})
            ess = f"{d['ess']:.3f}" if "ess" in d else "—"
            cells.append(ess + (f" / {d['masked']:.2%}" if "masked" in d else ""))
        rows.append([display(method), *cells])
    return markdown.table(["method (ESS / masked)", *by], rows, "l" + "r" * len(by))
