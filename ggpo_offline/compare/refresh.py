"""`ggpo report`: a committed report's tables recomputed from its raw counts with today's statistics."""

import json
from pathlib import Path

from ggpo_offline.compare.arc import ABLATIONS_COUNTS, ABLATIONS_FILE, ablation_table
from ggpo_offline.compare.ceilings import CEILINGS_FILE, read_ceilings
from ggpo_offline.compare.config import RefreshConfig
from ggpo_offline.compare.counts import COUNTS_FILE, Counts
from ggpo_offline.compare.report import STATISTICS, compute_report
from ggpo_offline.compare.tuning import TUNING_FILE, tuning_tables
from ggpo_offline.core.errors import UserError

STATISTICS_HEADING = "## Statistics\n\n"
TUNING_TABLES = "### Validation mean@"
"""Where a tuning README's tables begin (everything after it is `tuning_tables`)."""


def refresh_report(config: RefreshConfig) -> list[Path]:
    """Recompute table.md, table.csv, ceilings.md and ablations.md (or a tuning README's tables) from the
    folder's counts and write them into its README where the old ones stood; returns the files written.
    Figures, diagnostics and the runs' settings are left as they are (they come from the runs)."""
    folder = Path(config.folder)
    if (folder / TUNING_FILE).is_file():
        return _refresh_tuning(folder)
    if not (folder / COUNTS_FILE).is_file():
        raise UserError(f"{folder}: neither {COUNTS_FILE} nor {TUNING_FILE}; not a report folder")
    if (folder / CEILINGS_FILE).is_file() and config.ceilings is None:
        raise UserError(f"{folder} has {CEILINGS_FILE}: give --ceilings FILE to recompute it")
    readme = _read_readme(folder)
    derived = [name for name in ("table.md", CEILINGS_FILE, ABLATIONS_FILE) if (folder / name).is_file()]
    old = {name: (folder / name).read_text() for name in derived}
    for name, text in old.items():
        if text not in readme:
            raise UserError(f"{folder}/README.md no longer holds {name} as written; cannot place the new one")
    report = compute_report(Counts.read(folder / COUNTS_FILE), read_ceilings(config.ceilings))
    report.write(folder)
    new = {"table.md": report.tables, CEILINGS_FILE: report.ceilings}
    if (folder / ABLATIONS_COUNTS).is_file():
        ablations = json.loads((folder / ABLATIONS_COUNTS).read_text())
        new[ABLATIONS_FILE] = ablation_table(report.counts, ablations)
        (folder / ABLATIONS_FILE).write_text(new[ABLATIONS_FILE])
    for name, text in old.items():
        readme = readme.replace(text, new.get(name, text))
    (folder / "README.md").write_text(_with_statistics(readme))
    return [folder / name for name in ("README.md", "table.csv", *derived)]


def _read_readme(folder: Path) -> str:
    path = folder / "README.md"
    if not path.is_file():
        raise UserError(f"{folder}: no README.md to update")
    return path.read_text()


def _with_statistics(readme: str) -> str:
    """The README with its Statistics paragraph replaced by today's (the paragraph after the heading)."""
    start = readme.find(STATISTICS_HEADING)
    if start < 0:
        return readme
    start += len(STATISTICS_HEADING)
    end = readme.find("\n\n", start)
    return readme[:start] + STATISTICS + readme[end if end >= 0 else len(readme) :]


def _refresh_tuning(folder: Path) -> list[Path]:
    readme = _read_readme(folder)
    start = readme.find(TUNING_TABLES)
    if start < 0:
        raise UserError(f"{folder}/README.md holds no tuning tables ({TUNING_TABLES}...) to replace")
    sweep = json.loads((folder / TUNING_FILE).read_text())
    (folder / "README.md").write_text(readme[:start] + tuning_tables(sweep))
    return [folder / "README.md"]
