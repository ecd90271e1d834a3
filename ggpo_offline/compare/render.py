"""The report model and its one renderer: a README is named sections, those the runs gave kept in report.json
and those the counts give recomputed, rendered in each report kind's order."""

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from ggpo_offline import __version__
from ggpo_offline.compare.blocks import Block, Figure, Section, block, block_data, prose
from ggpo_offline.compare.counts import COUNTS_FILE
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, STATISTICS, Report
from ggpo_offline.core.errors import UserError, read_versioned, replace_text

REPORT_DATA = "report.json"
"""A report folder's run-derived sections, which `ggpo report` renders again beside recomputed scores."""
REPORT_FORMAT = "ggpo-offline report 2"
Kind = Literal["compare", "arc", "tuning", "ladder", "regimes"]
"""``ggpo compare`` (docs/demo, docs/beyond, docs/corrections), ``arc-report`` (docs/arc), ``tune-report``
(docs/tuning, docs/corrections/tuning), ``ladder-report`` (docs/ladder/tiny, docs/ladder/arc) and
``regimes-report`` (docs/regimes)."""

LAYOUTS: dict[str, tuple[str, ...]] = {
    "compare": ("heading", "results", "statistics", "pool", "data plans", "runs", "settings", "reproduce"),
    "arc": ("heading", "statistics", "results", "ceilings", "ablations", "styles", "raw data"),
    "tuning": ("heading", "note", "tables"),
    "ladder": ("heading", "against offline", "claims", "steps", "falls", "rounds"),
    "regimes": ("heading", "conditions", "against baseline", "diagnostics"),
}
"""Each kind's README, section names in the order shown; a name may hold several sections or none. A "note"
is prose written into a tuning report's report.json by hand (docs/corrections/tuning), kept when rendered."""

FILES = (
    f"Files: `table.md` and `table.csv` (every number above), `{COUNTS_FILE}` (the per-problem correct"
    " counts of every evaluation, validation and test, from which both tables are recomputed exactly:"
    " `write_tables(Counts.read(path), folder)` with both from `ggpo_offline.compare.report`),"
    f" `{DIAGNOSTICS_FILE}` (every run's drift, K3, ESS, entropy and gradient norm per update),"
    " `figure.png` and one PNG per panel."
)
"""A comparison README's list of its files, after the Statistics paragraph."""
RAW_DATA = (
    "`counts.json` holds every evaluation's per-problem correct counts (validation and test, every"
    " method, seed and update); `table.md` and `table.csv` are recomputed from it alone"
    " (`tests/test_report.py` checks the committed copy), and `ablations.md` from it and"
    " `ablations.json` (the ablation runs' validation counts); `ggpo report --folder` recomputes them."
    " `diagnostics.csv` holds every run's drift, K3, ESS, entropy and gradient norm per update;"
    " `styles.json` the full measure-styles reports."
)
"""The arc README's list of its raw data."""


@dataclass(frozen=True)
class ReportData:
    """report.json: a report's kind and the sections its runs gave (pool, settings, runs, commands...), which
    its raw data (counts.json, tuning.json, ladder.json, regimes.json) cannot give back."""

    kind: Kind
    sections: tuple[Section, ...]

    def write(self, folder: Path) -> None:
        sections = [
            {"name": s.name, "heading": s.heading, "blocks": [block_data(b) for b in s.blocks]}
            for s in self.sections
        ]
        data = {"format": REPORT_FORMAT, "kind": self.kind, "sections": sections}
        replace_text(folder / REPORT_DATA, json.dumps(data, indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def read(cls, folder: Path) -> "ReportData":
        """The folder's report.json; UserError in one line where it has none or another format."""
        path = folder / REPORT_DATA
        missing = f"{folder}: no {REPORT_DATA}; not a report folder written by ggpo-offline"
        data = read_versioned(path, (REPORT_FORMAT,), missing)
        if data.get("kind") not in LAYOUTS:
            raise UserError(f"{path}: a report of unknown kind {data.get('kind')!r}")
        sections = tuple(
            Section(s["name"], s["heading"], tuple(block(b) for b in s["blocks"])) for s in data["sections"]
        )
        return cls(data["kind"], sections)


FIGURE = Figure("figure.png", "validation accuracy, log ratio, ESS, gradient norm and entropy")
"""A comparison's and the arc's figure of every run's curves."""


def written_line(by: str = "") -> str:
    """The line that dates a report: this version, now, and (``by``) the command and its inputs."""
    return f"Written by ggpo-offline {__version__} on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC{by}."


def render(kind: Kind, sections: list[Section]) -> str:
    """The README: ``sections`` (run-derived and scored alike) in ``kind``'s order (`LAYOUTS`)."""
    unknown = {s.name for s in sections} - set(LAYOUTS[kind])
    if unknown:
        raise ValueError(f"a {kind} report has no section {', '.join(sorted(unknown))}")
    ordered = [s for name in LAYOUTS[kind] for s in sections if s.name == name]
    return "\n".join(line for section in ordered for line in section.markdown())


def write_readme(folder: Path, data: ReportData, scored: list[Section]) -> Path:
    """report.json, then README.md rendered from its sections and the ``scored`` ones; returns README.md."""
    data.write(folder)
    readme = folder / "README.md"
    replace_text(readme, render(data.kind, [*data.sections, *scored]))
    return readme


def compare_scores(report: Report) -> list[Section]:
    """A comparison's Results (tables, ceilings, figure) and Statistics (what its intervals mean, its
    files)."""
    results = (*report.tables, *report.ceilings, FIGURE)
    return [
        Section("results", "## Results", results),
        Section("statistics", "## Statistics", (prose(STATISTICS), prose(FILES))),
    ]


def arc_scores(report: Report, ablations: list[Block]) -> list[Section]:
    """The arc's Statistics, Results, ceilings and ablations (each where there is one) and raw data list."""
    sections = [
        Section("statistics", "## Statistics", (prose(STATISTICS),)),
        Section("results", "## Results", (*report.tables, FIGURE)),
    ]
    if report.ceilings:
        sections.append(Section("ceilings", "## Against the ceilings of selection", report.ceilings))
    if ablations:
        sections.append(Section("ablations", "## Ablations", tuple(ablations)))
    return [*sections, Section("raw data", "## Raw data", (prose(RAW_DATA),))]


def tuning_scores(tables: list[Block]) -> list[Section]:
    """A sweep's tables (`tuning.tuning_tables`), untitled: each begins with its own ### heading."""
    return [Section("tables", "", tuple(tables))]
