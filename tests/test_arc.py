"""`ggpo arc-report`: the arc's runs gathered from several compare reports, the ablations beside the default
runs, the style shares along the arc, and the report folder it writes (measure-styles replaced: no model)."""

import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import eval_settings, synthetic_metadata, write_synthetic_pool
from test_cli import assert_one_error_line, ggpo_here
from test_report import _record, _report, refuse_reading_back

from ggpo_offline.compare import arc as arc_module
from ggpo_offline.compare.arc import (
    ABLATIONS_COUNTS,
    _records,
    ablation_runs,
    ablation_table,
    arc_report,
    read_ablation_runs,
    styles_table,
    write_ablation_runs,
)
from ggpo_offline.compare.blocks import markdown_text
from ggpo_offline.compare.config import ArcConfig
from ggpo_offline.compare.counts import COUNTS_FILE, Counts
from ggpo_offline.compare.finished_runs import RunRecord
from ggpo_offline.compare.manifest import CompareManifest, ManifestRun
from ggpo_offline.compare.report import write_tables
from ggpo_offline.core.errors import UserError
from ggpo_offline.evaluate.eval_report import EvalReport, EvaluatedModel
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.run_records import RunSettings

BASE_MODEL = "models/tiny"
N = 8  # samples per problem: one more correct answer is +12.5 points on that problem


def _scored(report: EvalReport, model: str = BASE_MODEL) -> EvalReport:
    """An evaluation report naming the model it read, as the evaluator writes it."""
    return replace(report, settings=replace(eval_settings(), model=EvaluatedModel(model, model, "0" * 64)))


def _run(method: str, seed: int, evals: dict[int, list[int]]) -> RunRecord:
    """A finished run in memory from validation counts per update (``test_report``'s builder, scored)."""
    record = _record(method, seed, evals, n=N)
    return replace(record, evals={u: _scored(r) for u, r in record.evals.items()})


def _write_run(folder: Path, seed: int, evals: dict[int, list[int]], config: dict | None = None) -> Path:
    """A run folder as ``ggpo train`` leaves it: config, validation and test reports, result.json last."""
    run = RunFolder(folder)
    final = max(evals)
    selected = max(sorted(evals), key=lambda u: (sum(evals[u]), -u))
    reports = [(run.eval_report(u), "arith-validation", u) for u in evals]
    reports += [(run.test_report(u), "arith-test", u) for u in {selected, final}]
    for path, name, update in reports:
        path.parent.mkdir(parents=True, exist_ok=True)
        model = str(run.checkpoint(update)) if update else BASE_MODEL
        path.write_text(json.dumps(_scored(_report(name, evals[update], N), model).to_dict()))
    RunSettings(config or {}).write(folder)
    run.metrics_file.write_text(json.dumps({"update": 0, "mismatch/drift": 0.01}) + "\n")
    fingerprints = {"pool_fingerprint": "pool", "data_order_fingerprint": f"plan-{seed}"}
    run.result_file.write_text(json.dumps(fingerprints | {"updates": final, "selected_update": selected}))
    return folder


def _part(folder: Path, runs: dict[str, Path]) -> Path:
    """A compare report folder: its marker naming each run's folder."""
    folder.mkdir(parents=True, exist_ok=True)
    CompareManifest(
        status="finished",
        tool_version="0",
        updated="2026-01-01T00:00:00+00:00",
        command="ggpo compare",
        pool="pool.parquet",
        methods=(),
        seeds=(),
        runs={name: ManifestRun(str(path), "train") for name, path in runs.items()},
        data_order_fingerprints={},
    ).write(folder)
    return folder


BASE = [2, 2, 2, 2]  # 25 %
ARC_RUNS = {  # validation counts of 4 problems out of 8 at updates 0, 4, 8
    ("grpo", 42): {0: BASE, 4: [4] * 4, 8: [3] * 4},  # selected 4, final 8
    ("grpo", 1234): {0: BASE, 4: [3] * 4, 8: [3] * 4},
    ("ggpo", 42): {0: BASE, 4: [4] * 4, 8: [6] * 4},  # selected = final = 8
    ("ggpo", 1234): {0: BASE, 4: [5] * 4, 8: [6] * 4},
}


def _arc_parts(root: Path, config: dict | None = None) -> tuple[Path, Path]:
    """Two compare reports as `make arc` runs them side by side: one per method, every seed in each."""
    parts = []
    for method in ("grpo", "ggpo"):
        folder = root / f"part-{method}"
        written = {
            f"{m}-s{s}": _write_run(folder / "runs" / f"{m}-s{s}", s, evals, config)
            for (m, s), evals in ARC_RUNS.items()
            if m == method
        }
        parts.append(_part(folder, written))
    return parts[0], parts[1]


def test_runs_are_gathered_from_the_parts_seed_major(tmp_path):
    grpo, ggpo_part = _arc_parts(tmp_path)
    records = _records((str(ggpo_part), str(grpo)), ("grpo", "ggpo"), (42, 1234))
    assert [(r.method, r.seed) for r in records] == [
        ("grpo", 42),
        ("ggpo", 42),
        ("grpo", 1234),
        ("ggpo", 1234),
    ]
    assert records[3].run_dir == ggpo_part / "runs" / "ggpo-s1234"
    assert sorted(records[3].evals) == [0, 4, 8] and records[3].result.selected_update == 8


def test_a_run_missing_doubled_or_unfinished_is_refused(tmp_path):
    grpo, ggpo_part = _arc_parts(tmp_path)
    with pytest.raises(UserError, match="^the parts hold no finished run ggpo-s42, ggpo-s1234$"):
        _records((str(grpo),), ("grpo", "ggpo"), (42, 1234))
    # A compare stopped early lists its unfinished runs too: they count as missing, not as a crash.
    (ggpo_part / "runs" / "ggpo-s1234" / "result.json").unlink()
    with pytest.raises(UserError, match="^the parts hold no finished run ggpo-s1234$"):
        _records((str(grpo), str(ggpo_part)), ("grpo", "ggpo"), (42, 1234))
    with pytest.raises(UserError, match="^grpo seed 42 is in two of the parts$"):
        _records((str(grpo), str(grpo)), ("grpo",), (42,))
    with pytest.raises(
        UserError, match=f"^{tmp_path}: no compare.json; give folders written by ggpo compare$"
    ):
        _records((str(grpo), str(tmp_path)), ("grpo",), (42,))


DEFAULT_GGPO = {0: BASE, 4: [4, 5, 6, 7], 6: [7, 6, 5, 4], 8: [2, 3, 4, 5]}  # peak 68.75 at 4 and 6
ABLATED_GGPO = {0: BASE, 4: [3] * 4, 6: [5, 6, 7, 8], 7: [8, 7, 6, 5], 8: [3, 4, 5, 6]}  # peak 81.25 at 6, 7


def test_ablations_are_compared_with_the_default_run_at_its_peak_and_final_update(tmp_path):
    counts = Counts.from_records([_run("ggpo", 42, DEFAULT_GGPO)], ["ggpo"], [42])
    ablations = ablation_runs(
        {
            # +1 correct of 8 on every problem at the final update and between the (earliest) peaks
            "beta-0.003": [_run("agro", 42, ABLATED_GGPO), _run("ggpo", 42, ABLATED_GGPO)],
            "beta-0.03": [_run("ggpo", 42, DEFAULT_GGPO), _run("ggpo", 7, ABLATED_GGPO)],
        }
    )
    assert [(r.setting, r.method, r.seed) for r in ablations] == [
        ("beta-0.003", "agro", 42),
        ("beta-0.003", "ggpo", 42),
        ("beta-0.03", "ggpo", 42),
        ("beta-0.03", "ggpo", 7),
    ]
    assert ablations[1].evaluations["8"] == {"p0": 3, "p1": 4, "p2": 5, "p3": 6}
    # The table comes back from the file alone (as ablations.json is read when a report is recomputed).
    write_ablation_runs(tmp_path, ablations)
    assert read_ablation_runs(tmp_path) == ablations
    stored = json.loads((tmp_path / ABLATIONS_COUNTS).read_text())
    (tmp_path / ABLATIONS_COUNTS).write_text(json.dumps({**stored, "format": "ggpo-offline ablations 9"}))
    with pytest.raises(UserError, match="ablations.json has format 'ggpo-offline ablations 9'"):
        read_ablation_runs(tmp_path)
    assert markdown_text(ablation_table(counts, ablations)).split("\n") == [
        "### Ablations on validation (mean@n %, mean over seeds): peak and final beside the default settings",
        "",
        "| setting | method | seeds | peak (updates) | final | peak − final [95 %] | final − default final"
        " [95 %] | peak − default peak [95 %] |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        # agro (no default run of agro) and seed 7 (no default of that seed) are left out; one seed each:
        # however clear the difference, too few seeds for a verdict about the setting. Both fall 2 of 8.
        "| beta-0.003 | GGPO | 1 | 81.25 (6) | 56.25 | +25.00 [+25.00, +25.00] too few seeds"
        " | +12.50 [+12.50, +12.50] too few seeds | +12.50 [+12.50, +12.50] too few seeds |",
        "| beta-0.03 | GGPO | 1 | 68.75 (4) | 43.75 | +25.00 [+25.00, +25.00] too few seeds"
        " | +0.00 [+0.00, +0.00] too few seeds | +0.00 [+0.00, +0.00] too few seeds |",
        "",
        "Default settings (the arc preset), on the same seeds: GGPO seed 42: peak 68.75, final 43.75. Each"
        " difference is paired by seed and problem, its interval t on seeds − 1 df (`compare/stats.py`), and"
        " each column's rows are one family (Holm). A row of one seed is over problems only and describes the"
        " two runs: too few seeds for a verdict about the setting. peak − final is the setting's own fall"
        " from its best validation evaluation; the peak is a maximum over evaluations, so the fall leans high"
        " (a small one resolved is weak evidence; none at all, [+0.00, +0.00], is the peak being the last).",
        "",
    ]


def test_an_ablation_of_several_seeds_gets_the_seed_calibrated_interval_and_holm_verdicts():
    """Two seeds: seed 42 gains +1 correct of 8 on every problem (+12.5 points), seed 7 gains +3 (+37.5) at
    the final update; by hand, the mean is +25, the standard error the spread of the two seed means over
    sqrt(2) (12.5: no problem or residual variance), the interval ±t(0.975, 1 df) = 12.706 times it, and p
    = 2·P(T_1 > 2) = 0.2952 (not resolved); at the peaks every difference is 0."""
    default_7 = {0: BASE, 4: [4, 5, 6, 7], 6: [2, 2, 2, 2], 8: [1, 1, 1, 1]}  # peak 4, final 8
    counts = Counts.from_records(
        [_run("ggpo", 42, DEFAULT_GGPO), _run("ggpo", 7, default_7)], ["ggpo"], [42, 7]
    )
    gained = {  # the defaults' peaks kept, the finals raised
        42: {**DEFAULT_GGPO, 8: [3, 4, 5, 6]},
        7: {**default_7, 8: [4, 4, 4, 4]},
    }
    runs = ablation_runs(
        {
            "tref-never": [_run("ggpo", seed, gained[seed]) for seed in (42, 7)],
            # an ablation learner is compared with the runs of the learner it ablates
            "bounded-push": [_run("ggpo-bounded-push", seed, gained[seed]) for seed in (42, 7)],
        }
    )
    lines = markdown_text(ablation_table(counts, runs)).split("\n")
    half = 12.706205 * 12.5
    assert f"{-half + 25:+.2f}" == "-133.83" and f"{half + 25:+.2f}" == "+183.83"
    row = lines[4].split(" | ")
    assert " | ".join(row[:5] + row[6:]) == (
        "| tref-never | GGPO | 2 | 68.75 (4, 4) | 53.12 | +25.00 [-133.83, +183.83] not resolved"
        " | +0.00 [+0.00, +0.00] not resolved |"
    )
    # The fall is the setting's own, peak − final within each of its runs: seed 42 falls 1 of 8 on every
    # problem, seed 7 by 0, 1, 2, 3 (mean 15.625; the defaults' runs fall 25 and 56.25).
    assert row[5].startswith("+15.62 [") and row[5].endswith("] not resolved")
    assert lines[5] == lines[4].replace("tref-never | GGPO", "bounded-push | GGPO bounded push")
    assert lines[7].startswith(
        "Default settings (the arc preset), on the same seeds: GGPO seeds 42, 7: peak 68.75, final 28.12."
    )


STYLES = {  # measure_styles-like reports, "other" first and a style absent from the base model's
    "base model @ 0": {
        "accuracy": 0.41,
        "styles": {"careful": {"share": 0.5, "accuracy": 0.75}, "shortcut": {"share": 0.2, "accuracy": 0.6}}
        | {"draft": {"share": 0.3, "accuracy": 0.0}},
    },
    "GGPO @ 40": {
        "accuracy": 0.76,
        "styles": {"other": {"share": 0.1, "accuracy": 0.2}, "careful": {"share": 0.9, "accuracy": 0.8}}
        | {"draft": {"share": 0.0, "accuracy": None}},  # no draft sampled: its accuracy is undefined
    },
}


def test_the_styles_table_shows_each_share_and_its_accuracy():
    assert markdown_text(styles_table(STYLES, 16, 42)).split("\n") == [
        "### Style shares along the arc (seed 42; `measure-styles --no-forced`, 16 validation problems × 8)",
        "",
        "Each cell: share of the samples opening with that style, then (in parentheses) how often those are"
        " right. *other*: samples that open with no style marker, which the pool never shows.",
        "",
        "| checkpoint | mean@8 | careful | draft | shortcut | other |",
        "|---|---:|---:|---:|---:|---:|",
        "| base model @ 0 | 41.0 | 50% (75%) | 30% (0%) | 20% (60%) | 0% |",
        "| GGPO @ 40 | 76.0 | 90% (80%) | 0% (–) | 0% | 10% (20%) |",
        "",
    ]


MEASURED = {
    "model": "m",
    "split": "validation",
    "accuracy": 0.5,
    "pass_at_m": 0.75,
    "styles": {"careful": {"share": 0.6, "accuracy": 0.75}, "other": {"share": 0.4, "accuracy": 0.25}},
}
TRAIN_SETTINGS = {
    "updates": 8,
    "groups_per_batch": 4,
    "lr": 1e-5,
    "beta": 0.01,
    "ref_refresh": None,
    "eval_every": 4,
    "eval_num_problems": 4,
    "eval_n": N,
    "test_num_problems": 4,
}


class _Engine:
    """A stand-in for the engine arc-report starts once for every style measure: records what it started
    on and whether it was closed."""

    def __init__(self, name: str, model_dir: Path):
        self.started, self.closed = (name, str(model_dir)), False

    def close(self) -> None:
        self.closed = True


def _fake_measure_styles(monkeypatch) -> list[tuple]:
    """measure_styles replaced by one that records its calls; a stand-in module, since the real one imports
    torch and samples the model; the engine that serves them all is a stand-in too (first in the list)."""
    calls = []

    def start(name: str, model_dir: Path) -> _Engine:
        calls.append(_Engine(name, model_dir))
        return calls[-1]

    monkeypatch.setattr(arc_module, "_styles_engine", start)

    def measure_styles(model_dir: Path, **settings) -> dict:
        calls.append((str(model_dir), settings))
        return MEASURED

    module = types.ModuleType("ggpo_offline.organism.measure")
    module.measure_styles = measure_styles
    monkeypatch.setitem(sys.modules, "ggpo_offline.organism.measure", module)
    return calls


def test_the_arc_report_writes_every_file_and_its_tables_come_back_from_the_counts(tmp_path, monkeypatch):
    calls = _fake_measure_styles(monkeypatch)
    pool = tmp_path / "pool.parquet"
    write_synthetic_pool(pool, metadata=synthetic_metadata(4) | {"dataset": {"spec": "arith:train"}})
    config = TRAIN_SETTINGS | {"pool": str(pool)}
    first, second = _arc_parts(tmp_path, {**config, "ref_refresh": 8})
    ablated = {0: BASE, 4: [5] * 4, 8: [7] * 4}  # +12.5 points over the default GGPO seed 42, peak and final
    ablations = tmp_path / "ablations"
    (ablations / "unfinished").mkdir(parents=True)  # no compare.json: not an ablation
    run = _write_run(ablations / "beta-0.003" / "runs" / "ggpo-s42", 42, ablated, config)
    _part(ablations / "beta-0.003", {"ggpo-s42": run})
    out = tmp_path / "arc"
    arc_config = ArcConfig(
        methods=("grpo", "ggpo"),
        parts=(str(first), str(second)),
        seeds=(42, 1234),
        ablations=ablations,
        styles_problems=16,
        out=out,
    )
    with monkeypatch.context() as guard:  # the README shows the tables as computed, none read back
        refuse_reading_back(guard, out)
        assert arc_report(arc_config) == out

    for name in (
        "README.md",
        "table.md",
        "table.csv",
        COUNTS_FILE,
        "diagnostics.csv",
        "ablations.md",
        "styles.md",
        "styles.json",
    ):
        assert (out / name).is_file(), name
    (tmp_path / "again").mkdir()
    write_tables(Counts.read(out / COUNTS_FILE), tmp_path / "again")
    assert (tmp_path / "again" / "table.md").read_text() == (out / "table.md").read_text()
    assert (out / "ablations.md").read_text().splitlines()[4] == (
        "| beta-0.003 | GGPO | 1 | 87.50 (8) | 87.50 | +0.00 [+0.00, +0.00] too few seeds"
        " | +12.50 [+12.50, +12.50] too few seeds | +12.50 [+12.50, +12.50] too few seeds |"
    )
    recomputed = markdown_text(ablation_table(Counts.read(out / COUNTS_FILE), read_ablation_runs(out)))
    assert recomputed == (out / "ablations.md").read_text()
    # Styles of seed 42: the base model, then each run's selected and final checkpoint (once when equal).
    grpo, ggpo_run = RunFolder(first / "runs" / "grpo-s42"), RunFolder(second / "runs" / "ggpo-s42")
    models = [BASE_MODEL, str(grpo.checkpoint(4)), str(grpo.checkpoint(8)), str(ggpo_run.checkpoint(8))]
    engine, *calls = calls  # one vllm engine, started on the base model, serves every checkpoint
    assert engine.started == ("vllm", BASE_MODEL) and engine.closed
    settings = {"n_problems": 16, "forced": False, "split": "validation", "engine": engine}
    assert calls == [(model, settings) for model in models]
    keys = ["base model @ 0", "GRPO @ 4", "GRPO @ 8", "GGPO @ 8"]
    assert json.loads((out / "styles.json").read_text()) == dict.fromkeys(keys, MEASURED)
    styles = (out / "styles.md").read_text().splitlines()
    assert styles[4:6] == ["| checkpoint | mean@8 | careful | other |", "|---|---:|---:|---:|"]
    assert styles[6:10] == [f"| {key} | 50.0 | 60% (75%) | 40% (25%) |" for key in keys]

    readme = (out / "README.md").read_text()
    titles = [line for line in readme.splitlines() if line.startswith("## ")]
    assert titles == [
        "## Statistics",
        "## Results",
        "## Ablations",
        "## What the learners select",
        "## Raw data",
    ]
    assert (
        f"Methods: GRPO, GGPO; seeds 42, 1234; pool `{pool}` (synthetic, `arith:train`, m = 4); U = 8"
        in readme
    )
    assert (
        "U = 8 updates of G = 4 groups, lr 1e-5, β 0.01, T_ref 8 (learners that refresh π_ref), validation"
        " evaluation every 4 updates (4 problems × 8), test once per run at the end (4 problems)."
    ) in readme
    for name in ("table.md", "ablations.md", "styles.md"):
        assert (out / name).read_text() in readme
    # Learners trained at their own rates (a preset's rate per learner): the README gives each one's.
    for seed in (42, 1234):
        path = second / "runs" / f"ggpo-s{seed}" / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"lr": 3e-5}))
    arc_report(arc_config)
    assert "groups, lr per learner GRPO 1e-5, GGPO 3e-5, β 0.01" in (out / "README.md").read_text()


def test_with_ceilings_the_arc_report_sets_each_method_against_them_and_refuses_a_bad_file_first(
    tmp_path, monkeypatch
):
    from test_report import STYLES_REPORT

    from ggpo_offline.compare.against_ceilings import ceilings_section
    from ggpo_offline.compare.scores import Scores

    _fake_measure_styles(monkeypatch)
    pool = tmp_path / "pool.parquet"
    write_synthetic_pool(pool, metadata=synthetic_metadata(4) | {"dataset": {"spec": "arith:train"}})
    first, second = _arc_parts(tmp_path, TRAIN_SETTINGS | {"pool": str(pool)})
    arith_ids = {"p0": "arith-L1-0", "p1": "arith-L1-1", "p2": "arith-L4-2", "p3": "arith-L4-3"}
    for run in tmp_path.glob("part-*/runs/*"):  # as compare tests the base model too
        base = _scored(_report("arith-test", BASE, N))
        RunFolder(run).test_report(0).write_text(json.dumps(base.to_dict()))
    for path in tmp_path.glob("part-*/runs/*/eval/test/*.json"):  # test problems that name their class
        report = json.loads(path.read_text())
        scores = report["benchmarks"]["arith-test"]
        scores["counts"] = {arith_ids[p]: c for p, c in scores["counts"].items()}
        path.write_text(json.dumps(report))
    styles = tmp_path / "styles.json"
    styles.write_text(json.dumps(STYLES_REPORT))
    out = tmp_path / "arc"
    config = ArcConfig(
        methods=("grpo", "ggpo"), parts=(str(first), str(second)), seeds=(42, 1234), ceilings=styles, out=out
    )
    arc_report(config)

    expected = markdown_text(
        ceilings_section(Scores(Counts.read(out / COUNTS_FILE)), ["grpo", "ggpo"], STYLES_REPORT)
    )
    assert expected.startswith("### Against the ceilings of selection: test at the selected checkpoint")
    assert (out / "ceilings.md").read_text() == expected
    readme = (out / "README.md").read_text()
    assert "## Against the ceilings of selection\n\n" + expected in readme
    assert readme.index("## Results") < readme.index("## Against the ceilings") < readme.index("## What the")

    free_only = tmp_path / "free.json"
    free_only.write_text(json.dumps({"styles": {}, "forced_by_class": {}}))
    (out / "styles.md").unlink()
    with pytest.raises(UserError, match=r"^--ceilings .*free.json: not a `ggpo measure-styles --json`"):
        arc_report(replace(config, ceilings=free_only))
    assert not (out / "styles.md").exists()  # refused before the style measures
    arc_report(replace(config, ceilings=None))  # a report without --ceilings shows no earlier one's
    assert not (out / "ceilings.md").exists()
    assert "## Against the ceilings" not in (out / "README.md").read_text()


def test_a_styles_seed_outside_the_seeds_is_refused_where_the_config_is_built(tmp_path):
    with pytest.raises(UserError, match="^--styles-seed 42 is not one of --seeds 1234$"):
        ArcConfig(methods=("grpo",), parts=(str(tmp_path / "none"),), seeds=(1234,), out=tmp_path / "arc")
    assert not (tmp_path / "arc").exists()


def test_a_part_that_is_no_compare_report_is_one_error_line(tmp_path):
    out = tmp_path / "arc"
    result = ggpo_here("arc-report", "--methods", "grpo", "--parts", str(tmp_path), "--out", str(out))
    assert result.returncode == 1
    assert_one_error_line(result, f"error: {tmp_path}: no compare.json; give folders written by ggpo compare")
    assert not out.exists()
