"""The learner tables of README.md, docs/learners.md (ablations) and docs/corrections.md as text, generated
from the registry (never by hand); `tools/write_learner_tables.py` writes them into those files."""

from ggpo_offline.core import markdown
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import flag_name, valid_range
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.correction_presets import COMMITS
from ggpo_offline.train.learners import CORRECTIONS, PAPER_REF_REFRESH, REGISTRY, SCHEDULES, SYMBOLS, Learner

README_BEGIN = "<!-- learners:begin -->"
README_END = "<!-- learners:end -->"
ABLATIONS_BEGIN = "<!-- ablations:begin -->"
ABLATIONS_END = "<!-- ablations:end -->"
CORRECTIONS_BEGIN = "<!-- corrections:begin -->"
CORRECTIONS_END = "<!-- corrections:end -->"


def _flag(setting: str) -> str:
    return f"`--{flag_name(TrainConfig, setting)}`"


def _hyperparameters_cell(entry: Learner) -> str:
    """Its settings, each with its range where a learner narrows the field's (β): the narrowed one, or the
    field's own."""
    narrowed = {name for learner in REGISTRY for name in learner.bounds}
    bounds = {name: f" {entry.bounds.get(name, valid_range(TrainConfig, name))}" for name in narrowed}
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


def markdown_table(ablations: bool = False) -> str:
    """The learner table of README.md, one row per registry entry that is not an ablation, or with
    ``ablations`` docs/learners.md's table of the ablations (written between the files' markers by
    `tools/write_learner_tables.py`)."""
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
    for entry in (entry for entry in REGISTRY if (entry.ablates is not None) == ablations):
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


def corrections_table() -> str:
    """docs/corrections.md's table: each framework preset, the knobs it reproduces, its parts, the framework
    function whose update it equals, and where the framework's code and its docs differ."""
    header = ["method", "framework", "its settings (defaults where not written)", "parts", "equal to", "SPEC",
              "note"]  # fmt: skip
    rows = [
        [f"`{entry.name}`", preset.framework, f"`{preset.knobs}`", entry.summary,
         f"{preset.framework}@{COMMITS[preset.framework]} {preset.equals}", f"§{preset.section}",
         preset.note or "—"]
        for entry, preset in ((entry, entry.correction_preset) for entry in CORRECTIONS)
    ]  # fmt: skip
    return "\n".join(markdown.table(header, rows)) + "\n"


def _with_block(text: str, begin: str, end: str, block: str, name: str) -> str:
    """``text`` with the lines between its ``begin`` and ``end`` markers replaced by ``block``."""
    if text.count(begin) != 1 or text.count(end) != 1:
        raise UserError(f"{name} needs one {begin} line and one {end} line")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{block}{end}{rest.split(end)[1]}"


def with_learner_table(readme: str) -> str:
    """``readme`` with the text between its learner markers replaced by `markdown_table()`."""
    return _with_block(readme, README_BEGIN, README_END, markdown_table(), "README.md")


def with_ablations_table(doc: str) -> str:
    """docs/learners.md's text with its generated block replaced by the ablations' table."""
    table = markdown_table(ablations=True)
    return _with_block(doc, ABLATIONS_BEGIN, ABLATIONS_END, table, "docs/learners.md")


def with_corrections_table(doc: str) -> str:
    """docs/corrections.md's text with its generated block replaced by `corrections_table()`."""
    return _with_block(doc, CORRECTIONS_BEGIN, CORRECTIONS_END, corrections_table(), "docs/corrections.md")
