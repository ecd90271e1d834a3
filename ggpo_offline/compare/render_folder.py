"""`ggpo report`: a report folder's README rendered again, whole, from its report.json and its counts, the
scores recomputed with today's statistics."""

from pathlib import Path

from ggpo_offline.compare import render
from ggpo_offline.compare.against_ceilings import CEILINGS_FILE, read_ceilings
from ggpo_offline.compare.arc import ABLATIONS_FILE, write_ablations
from ggpo_offline.compare.config import RefreshConfig
from ggpo_offline.compare.counts import COUNTS_FILE, Counts
from ggpo_offline.compare.ladder import Ladder, ladder_sections
from ggpo_offline.compare.regimes import Regimes, regimes_sections
from ggpo_offline.compare.render import ReportData, arc_scores, compare_scores, tuning_scores
from ggpo_offline.compare.report import compute_report
from ggpo_offline.compare.tuning import Sweep, tuning_tables
from ggpo_offline.core.errors import UserError


def render_folder(config: RefreshConfig) -> list[Path]:
    """Recompute the folder's scores from its raw counts (counts.json with ceilings and ablations.json, or
    tuning.json) into table.md, table.csv, ceilings.md and ablations.md, then render its README from them and
    report.json's sections; returns the files written. Figures and diagnostics are left as they are (they
    come from the runs)."""
    folder = Path(config.folder)
    data = ReportData.read(folder)
    if data.kind == "tuning":
        return [render.write_readme(folder, data, tuning_scores(tuning_tables(Sweep.read(folder))))]
    if data.kind == "ladder":
        return [render.write_readme(folder, data, ladder_sections(Ladder.read(folder)))]
    if data.kind == "regimes":
        return [render.write_readme(folder, data, regimes_sections(Regimes.read(folder)))]
    counts = _raw(folder, COUNTS_FILE)
    if (folder / CEILINGS_FILE).is_file() and config.ceilings is None:
        raise UserError(f"{folder} has {CEILINGS_FILE}: give --ceilings FILE to recompute it")
    report = compute_report(Counts.read(counts), read_ceilings(config.ceilings))
    report.write(folder)
    written = ["table.csv", "table.md", *([CEILINGS_FILE] if report.ceilings else [])]
    if data.kind == "compare":
        return [render.write_readme(folder, data, compare_scores(report)), *(folder / n for n in written)]
    ablations = write_ablations(folder, report.counts)
    written += [ABLATIONS_FILE] if ablations else []
    return [render.write_readme(folder, data, arc_scores(report, ablations)), *(folder / n for n in written)]


def _raw(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise UserError(f"{folder}: no {name}, the raw counts its report.json's scores come from")
    return path
