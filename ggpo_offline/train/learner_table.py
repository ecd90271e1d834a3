"""The README's learner table, generated from the registry and the settings' flags (never written by hand)."""

import sys
from pathlib import Path

from ggpo_offline.core import markdown
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import flag_name
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.learners import PAPER_REF_REFRESH, REGISTRY, SCHEDULES, SYMBOLS, Learner

README_BEGIN = "<!-- learners:begin -->"
README_END = "<!-- learners:end -->"
README = Path(__file__).resolve().parents[2] / "README.md"


def _flag(setting: str) -> str:
    return f"`--{flag_name(TrainConfig, setting)}`"


def _hyperparameters_cell(entry: Learner) -> str:
    bounds = {name: f" {bound}" for name, bound in entry.bounds.items()}
    read = [_flag(name) + bounds.get(name, "") for name in entry.hyperparameters]
    fixed = [f"{name} = {value:g} (fixed)" for name, value in entry.fixed.items()]
    return ", ".join(read + fixed) or "—"


def _references_cell(entry: Learner) -> str:
    schedules = {need: f" ({_flag(setting)})" for need, setting in SCHEDULES.items()}
    return ", ".join(SYMBOLS[need] + schedules.get(need, "") for need in entry.needs) or "—"


def _refresh_cell(entry: Learner) -> str:
    if not entry.reads("ref_refresh"):
        return "—"
    return f"every {PAPER_REF_REFRESH}" if entry.refreshes_reference else "no (π0 unless given)"


def markdown_table() -> str:
    """The learner table of README.md, one row per registry entry (written between the README's markers by
    `python -m ggpo_offline.train.learner_table`)."""
    header = [
        "method",
        "label",
        "update",
        "hyperparameters",
        "references (schedule)",
        "refreshes π_ref by default",
        "defined in",
    ]
    rows = []
    for entry in REGISTRY:
        cells = [
            f"`{entry.name}`",
            entry.label,
            entry.summary,
            _hyperparameters_cell(entry),
            _references_cell(entry),
            _refresh_cell(entry),
            entry.formula,
        ]
        rows.append(cells)
    return "\n".join(markdown.table(header, rows)) + "\n"


def with_learner_table(readme: str) -> str:
    """``readme`` with the text between its learner markers replaced by `markdown_table()`."""
    if readme.count(README_BEGIN) != 1 or readme.count(README_END) != 1:
        raise UserError(f"README.md needs one {README_BEGIN} line and one {README_END} line")
    head, rest = readme.split(README_BEGIN)
    tail = rest.split(README_END)[1]
    return f"{head}{README_BEGIN}\n{markdown_table()}{README_END}{tail}"


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else README
    path.write_text(with_learner_table(path.read_text()))
    print(f"wrote the learner table into {path}")
