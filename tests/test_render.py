"""The report model and its one renderer: sections rendered in each kind's order, report.json written and read
back, and `ggpo report` rendering every committed report's README again, byte for byte, from its data."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cli import assert_one_error_line, ggpo_here

from ggpo_offline.compare.blocks import Code, Figure, Table, markdown_text, number, prose
from ggpo_offline.compare.config import RefreshConfig
from ggpo_offline.compare.render import (
    FIGURE,
    REPORT_DATA,
    ReportData,
    Section,
    arc_scores,
    render,
    tuning_scores,
    write_readme,
)
from ggpo_offline.compare.render_folder import render_folder
from ggpo_offline.compare.report import STATISTICS, Report
from ggpo_offline.core.errors import UserError

REPO = Path(__file__).resolve().parents[1]
FIGURE_LINE = FIGURE.lines()[0]
CEILINGS = REPO / "ggpo_offline" / "organism" / "tiny_model" / "styles.json"
COMMITTED = (
    "demo",
    "beyond",
    "corrections",
    "arc",
    "tuning",
    "corrections/tuning",
    "corrections/tuning/rerun-2026-12-06",
    "ladder/tiny-sync1",
    "ladder/tiny-sync4",
    "ladder/arc-sync4",
    "ladder/tiny",
    "ladder/arc",
    "regimes",
    *(f"regimes/{c}" for c in ("offline", "tau1.2", "tau1.4", "lag0", "lag1", "lag4-mixed", "tau1.2-lag2")),
)
"""Every report folder under docs/ (`make demo`, beyond, corrections, arc, tune-lr, tune-corrections, ladder,
regimes)."""


def test_sections_render_in_the_kinds_order_each_block_set_off_by_blank_lines():
    sections = [
        Section("tables", "", (prose("### Rates"), Table(("a",), ((number("{:.2f}", 0.5),),)))),
        Section("note", "", (prose("Edited by hand."),)),
        Section("heading", "# A sweep", (prose("Written then.", "Every run: pool p."),)),
    ]
    assert render("tuning", sections) == (
        "# A sweep\n\nWritten then.\nEvery run: pool p.\n\nEdited by hand.\n\n### Rates\n\n| a |\n|---|\n"
        "| 0.50 |\n"
    )
    shared = Section("settings", "## Shared", (Table(("a",), (("x",),)),))
    differing = Section("settings", "## Differing", (Code("bash", ("ggpo train",)),))
    # A name's sections keep their order; the layout places the name.
    assert render("compare", [shared, differing, Section("pool", "## Pool", (prose("- file"),))]) == (
        "## Pool\n\n- file\n\n## Shared\n\n| a |\n|---|\n| x |\n\n## Differing\n\n```bash\nggpo train\n```\n"
    )
    with pytest.raises(ValueError, match="^a tuning report has no section pool$"):
        render("tuning", [Section("pool", "## Pool", ())])


def test_a_number_keeps_its_values_whole_and_writes_them_with_its_format():
    cell = number("{:.2f} ± {:.2f}", 52.456, 3.14159)
    assert cell.text() == "52.46 ± 3.14" and cell.values == (52.456, 3.14159)
    assert cell.within("**", "**").text() == "**52.46 ± 3.14**"
    assert cell.within("− 3e-4: {", "} †").text() == "− 3e-4: {52.46 ± 3.14} †"  # braces kept as written
    assert markdown_text([prose("### T"), Table(None, (("gap", cell),), "lr")]) == (
        "### T\n\n| | |\n|---|---:|\n| gap | 52.46 ± 3.14 |\n"
    )


def test_the_arc_shows_its_scores_between_its_heading_and_its_styles_and_skips_what_it_lacks():
    report = Report(counts=None, tables=(prose("### T"),), rows=(), ceilings=())
    styles = Section("styles", "## What the learners select", (prose("### S"),))
    heading = Section("heading", "# Arc", (prose("Written."),))
    text = render("arc", [styles, heading, *arc_scores(report, [])])
    opening = (
        f"# Arc\n\nWritten.\n\n## Statistics\n\n{STATISTICS}\n\n## Results\n\n### T\n\n{FIGURE_LINE}\n\n"
    )
    assert text.startswith(opening)
    assert "## Against the ceilings" not in text and "## Ablations" not in text
    assert text.index("## What the learners select\n\n### S\n") < text.index("## Raw data\n\n`counts.json`")
    with_both = render(
        "arc", arc_scores(Report(None, (prose("t"),), (), ceilings=(prose("c"),)), [prose("a")])
    )
    assert "## Against the ceilings of selection\n\nc\n\n## Ablations\n\na\n\n## Raw data" in with_both


def test_compares_readme_is_its_run_sections_kept_in_report_json_and_its_scores_rendered_once(tmp_path):
    from conftest import write_synthetic_pool

    from ggpo_offline.compare.comparison import PlannedRun, run_configs
    from ggpo_offline.compare.config import CompareConfig
    from ggpo_offline.compare.render import compare_scores
    from ggpo_offline.compare.run_sections import write_readme as write_compare_readme
    from ggpo_offline.train.pool_index import check_pool
    from ggpo_offline.train.run_inputs import Fingerprints
    from ggpo_offline.train.sampler_mismatch import SamplerMismatch

    pool = write_synthetic_pool(tmp_path / "p.parquet")
    config = CompareConfig(pool=pool, methods=("grpo", "ggpo"), seeds=(1,), preset="tiny", out=tmp_path / "r")
    planned = [
        PlannedRun(run, action, Fingerprints("pool-sha", "plan-1"))
        for run, action in zip(run_configs(config), ("train", "reuse"), strict=True)
    ]
    measured = SamplerMismatch(0.0132, 0.0054, 0.0036, 1.05, 0.7637, 1.0, 1.002, 1.007, 0.0039, 8, 100)
    first = [{"update": 0, **measured.metrics()}, {"update": 1}]
    records = [
        SimpleNamespace(seed=1, result=SimpleNamespace(run_id=f"id-{i}"), metrics=metrics)
        for i, metrics in enumerate((first, []))
    ]
    report = Report(counts=None, tables=(prose("### Tables"),), rows=(), ceilings=(prose("### Ceilings"),))
    config.report_dir.mkdir()
    write_compare_readme(config, check_pool(pool), planned, records, {1: "plan-1"}, None, report)
    data = ReportData.read(config.report_dir)
    names = ["heading", "pool", "data plans", "runs", "settings", "settings", "reproduce"]
    assert data.kind == "compare" and [s.name for s in data.sections] == names
    readme = (config.report_dir / "README.md").read_text()
    assert readme == render("compare", [*data.sections, *compare_scores(report)])
    assert (
        f"## Results\n\n### Tables\n\n### Ceilings\n\n{FIGURE_LINE}\n\n## Statistics\n\n{STATISTICS}\n\n"
        in readme
    )
    assert (
        "## Data plans\n\n| seed | data-order fingerprint | runs |\n|---:|---|---:|\n| 1 | `plan-1` | 2 |\n\n"
        in readme
    )
    assert "MLflow: not tracked (--no-tracking).\n\n| run | this report | MLflow run | folder |\n" in readme
    assert (
        "- sampler against the learner before any update (`sampler/*` at update 0): mean |Δ log π| 0.0132, "
        "K3 0.0054 (NeMo-RL's gen_kl_error), mean |π − μ| 0.0036 (verl's rollout_probs_diff_mean), sequence "
        "ESS 0.7637, token ratio p05 / p50 / p95 1.0000 / 1.0020 / 1.0070, 0.39% of token ratios outside "
        "[0.5, 2]\n" in readme
    )
    assert "| ggpo-s1 | reused | `id-1` |" in readme and readme.endswith(
        "--out " + str(planned[1].config.run_dir) + "\n```\n"
    )


def test_report_json_comes_back_as_written_and_the_readme_is_rendered_from_it(tmp_path):
    table = Table(("lr", "mean"), (("3e-4", number("{:.2f} ({})", 52.456, "10/20")),), "lr")
    heading = Section(
        "heading", "# A sweep", (prose("Written then, ±, π."), table, Figure("f.png", "curves"))
    )
    reproduce = Section("note", "", (Code("bash", ("ggpo tune",)),))
    data = ReportData("tuning", (heading, reproduce))
    readme = write_readme(tmp_path, data, tuning_scores([prose("### Rates")]))
    assert readme.read_text() == (
        "# A sweep\n\nWritten then, ±, π.\n\n| lr | mean |\n|---|---:|\n| 3e-4 | 52.46 (10/20) |\n\n"
        "![curves](f.png)\n\n```bash\nggpo tune\n```\n\n### Rates\n"
    )
    assert ReportData.read(tmp_path) == data
    stored = json.loads((tmp_path / REPORT_DATA).read_text())
    assert stored["format"] == "ggpo-offline report 2"
    # The data, not the text: each number whole, with the format that writes it.
    assert stored["sections"][0]["blocks"][1]["table"]["rows"] == [
        ["3e-4", {"format": "{:.2f} ({})", "values": [52.456, "10/20"]}]
    ]
    (tmp_path / REPORT_DATA).write_text('{"format": "ggpo-offline report 1", "kind": "tuning"}')
    with pytest.raises(
        UserError, match="has format 'ggpo-offline report 1'; .* reads format ggpo-offline report 2$"
    ):
        ReportData.read(tmp_path)
    (tmp_path / REPORT_DATA).write_text('{"format": "ggpo-offline report 2", "kind": "poem"}')
    with pytest.raises(UserError, match="report.json: a report of unknown kind 'poem'$"):
        ReportData.read(tmp_path)


@pytest.mark.parametrize("name", COMMITTED)
def test_ggpo_report_renders_each_committed_readme_again_byte_for_byte(tmp_path, name):
    committed, folder = REPO / "docs" / name, tmp_path / "report"
    shutil.copytree(committed, folder)
    # What the runs gave is in report.json; what the counts give is recomputed, not read from the old text.
    (folder / "README.md").write_text("# edited by hand\n")
    for derived in ("table.md", "table.csv", "ceilings.md", "ablations.md"):
        if (folder / derived).is_file():
            (folder / derived).write_text("stale\n")
    ceilings = CEILINGS if (committed / "ceilings.md").is_file() else None
    written = render_folder(RefreshConfig(folder=folder, ceilings=ceilings))
    assert written[0] == folder / "README.md"
    for path in committed.rglob("*"):
        if path.is_file():
            copy = folder / path.relative_to(committed)
            assert copy.read_bytes() == path.read_bytes(), path.relative_to(committed)


def test_ggpo_report_refuses_a_folder_without_report_data_or_its_counts_in_one_line(tmp_path):
    assert_one_error_line(
        ggpo_here("report", "--folder", str(tmp_path)), "no report.json; not a report folder written by"
    )
    shutil.copy(REPO / "docs" / "tuning" / REPORT_DATA, tmp_path / REPORT_DATA)
    assert_one_error_line(
        ggpo_here("report", "--folder", str(tmp_path)), "no tuning.json, the raw counts its report.json's"
    )
