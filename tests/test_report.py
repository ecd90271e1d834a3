"""The comparison report: counts.json, tables ranked by paired intervals, pairwise verdicts, the paper's
claims, and committed reports recomputed from their raw counts."""

import csv
import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
from conftest import eval_settings

from ggpo_offline.compare.blocks import markdown_text
from ggpo_offline.compare.counts import COUNTS_FILE, Counts
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, FIGURES, RunRecord, write_report, write_tables
from ggpo_offline.compare.stats import holm
from ggpo_offline.core.errors import UserError
from ggpo_offline.evaluate.benchmark_scores import aggregate
from ggpo_offline.evaluate.eval_report import EvalReport
from ggpo_offline.train.run_records import RunResult, RunSettings

REPO = Path(__file__).resolve().parents[1]
CEILINGS = REPO / "ggpo_offline" / "organism" / "tiny_model" / "styles.json"
SEEDS = (42, 1234, 2027)


def _report(name: str, counts, n: int = 4, ks=(1, 4)) -> EvalReport:
    """One benchmark's evaluation, scored from its per-problem counts (prompt ids p0, p1, ...)."""
    return _scored({name: {f"p{i}": int(c) for i, c in enumerate(counts)}}, n, ks)


def _scored(counts: dict[str, dict[str, int]], n: int, ks) -> EvalReport:
    benchmarks, suite = aggregate(counts, n, ks)
    return EvalReport(n, tuple(ks), benchmarks, suite, settings=eval_settings(), run={})


def _record(method, seed, evals, tests=None, selected=None, drift=(), n=4) -> RunRecord:
    """A finished run from per-problem counts: ``evals`` and ``tests`` map updates to count lists."""
    return RunRecord(
        method=method,
        seed=seed,
        run_dir=Path(f"runs/{method}-s{seed}"),
        settings=RunSettings({}),
        result=RunResult(pool_fingerprint="pool", data_order_fingerprint="plan", selected_update=selected),
        evals={u: _report("arith-validation", c, n) for u, c in evals.items()},
        metrics=[{"update": u, "mismatch/drift": d} for u, d in enumerate(drift)],
        tests={u: _report("arith-test", c, n) for u, c in (tests or {}).items()},
    )


def _simulated(curves: dict, problems: int = 200, n: int = 8, seed: int = 0, test: bool = True) -> list:
    """Runs whose true accuracy per update is ``curves[method][update]`` on problems of varied difficulty;
    every run shares the base model's counts (update 0), as runs of one comparison do. Each run's selected
    checkpoint is its best validation update (the earliest among equals)."""
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(0.0, 1.0, problems)

    def draw(accuracy: float) -> list[int]:
        logit = np.log(accuracy / (1 - accuracy)) + difficulty
        return rng.binomial(n, 1 / (1 + np.exp(-logit))).tolist()

    first = next(iter(curves.values()))
    base_val, base_test = draw(first[0]), draw(first[0])
    final = max(first)
    records = []
    for method, curve in curves.items():
        for run_seed in SEEDS:
            evals = {u: base_val if u == 0 else draw(acc) for u, acc in curve.items()}
            selected = max(sorted(evals), key=lambda u: (sum(evals[u]), -u))
            tests = {u: base_test if u == 0 else draw(curve[u]) for u in {selected, final}} if test else {}
            drift = [0.01 + 0.0001 * u for u in range(final)]
            records.append(_record(method, run_seed, evals, tests, selected if test else None, drift, n))
    return records


def refuse_reading_back(monkeypatch, folder: Path) -> None:
    """Make opening a markdown file of ``folder`` (the report's own, not its runs') for reading fail: what a
    command writes there it renders from the computed report, never by reading the file back."""
    opened = Path.open

    def guarded(path: Path, mode: str = "r", *args, **kwargs):
        if path.suffix == ".md" and path.parent.resolve() == folder.resolve() and not set(mode) & set("wax"):
            raise AssertionError(f"{path} was read back")
        return opened(path, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", guarded)  # read_text and read_bytes open the file through it


def _tables(records, methods, tmp_path) -> str:
    seeds = sorted({r.seed for r in records}, key=[r.seed for r in records].index)
    return write_tables(Counts.from_records(records, methods, seeds), tmp_path)


def test_tables_report_mean_and_sample_std_over_seeds(tmp_path):
    base = [2, 2, 2, 2, 2, 0, 0, 0, 0, 0]  # mean@4 25 %, pass@4 50 %
    finals = {
        ("grpo", 1): [3, 3, 3, 3, 0, 0, 0, 0, 0, 0],  # 30 %, pass@4 40 %
        ("grpo", 2): [4, 4, 4, 4, 0, 0, 0, 0, 0, 0],  # 40 %, pass@4 40 %
        ("ggpo", 1): [4, 4, 4, 4, 4, 0, 0, 0, 0, 0],  # 50 %, pass@4 50 %
        ("ggpo", 2): [4, 4, 4, 4, 4, 1, 0, 0, 0, 0],  # 52.5 %, pass@4 60 %
    }
    records = [_record(m, s, {0: base, 8: c}) for (m, s), c in finals.items()]
    markdown = _tables(records, ["grpo", "ggpo"], tmp_path)
    grpo_std, ggpo_std = statistics.stdev([30.0, 40.0]), statistics.stdev([50.0, 52.5])  # ddof = 1
    assert "| 0 | **25.00 ± 0.00** | 25.00 ± 0.00 † |" in markdown  # equal: not resolved below the best
    assert f"| 35.00 ± {grpo_std:.2f}" in markdown and f"| **51.25 ± {ggpo_std:.2f}** |" in markdown
    # Without a test evaluation the end-of-run table reads validation's final update.
    assert "### Validation at the final update 8 (no test evaluation) on arith-validation (%)" in markdown
    assert "| base model | 0 | 25.00 ± 0.00 | 25.00 ± 0.00 | 50.00 ± 0.00 | 0.00 ± 0.00 |" in markdown
    with (tmp_path / "table.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    row = next(r for r in rows if r["table"] == "end" and r["method"] == "ggpo" and r["metric"] == "pass@4")
    assert float(row["mean"]) == pytest.approx(55.0) and float(row["std"]) == pytest.approx(
        statistics.stdev([50.0, 60.0])
    )
    assert (row["split"], row["update"], row["seeds"], row["values"]) == ("validation", "8", "2", "50 60")
    gain = next(
        r for r in rows if r["table"] == "end" and r["method"] == "grpo" and r["metric"] == "gain in mean@4"
    )
    assert gain["values"] == "5 15"  # each run's final mean@4 minus its own update 0


def test_test_tables_report_the_selected_and_the_final_checkpoint(tmp_path):
    base, half, three = [1] * 10, [2] * 10, [3] * 10  # 25 %, 50 %, 75 % mean@4 on every problem
    evals = {0: base, 4: half, 8: half}
    records = [
        _record("grpo", 1, evals, tests={0: base, 4: half, 8: base}, selected=4),
        _record("grpo", 2, evals, tests={0: base, 8: half}, selected=8),
        _record("ggpo", 1, evals, tests={0: base, 8: three}, selected=8),
        _record("ggpo", 2, evals, tests={0: base, 8: three}, selected=8),
    ]
    markdown = _tables(records, ["grpo", "ggpo"], tmp_path)
    selected = markdown[markdown.index("### Test at the selected checkpoint") :]
    assert selected.startswith(
        "### Test at the selected checkpoint (best validation mean@n, earliest on ties) on arith-test (%)"
    )
    # Columns: mean@4, pass@1, pass@4 (1 correct of 4 already passes at k = 4), gain in mean@4.
    assert "| base model | 0 | 25.00 ± 0.00 | 25.00 ± 0.00 | 100.00 ± 0.00 | 0.00 ± 0.00 |" in selected
    # Each seed's own selection; equal pass@4: the first listed is bold, the other not resolved below it.
    assert "| GRPO | 4, 8 | 50.00 ± 0.00 | 50.00 ± 0.00 | **100.00 ± 0.00** | 25.00 ± 0.00 |" in selected
    assert "| GGPO | 8 | **75.00 ± 0.00** | **75.00 ± 0.00** | 100.00 ± 0.00 † | 50.00 ± 0.00 |" in selected
    final = markdown[markdown.index("### Test at the final checkpoint (update 8) on arith-test (%)") :]
    std = statistics.stdev([25.0, 50.0])
    # GGPO − GRPO is +25 and +50 on the two seeds: t on 1 df cannot resolve it (GRPO marked †).
    assert (
        f"| GRPO | 8 | 37.50 ± {std:.2f} † | 37.50 ± {std:.2f} † | **100.00 ± 0.00** | 12.50 ± {std:.2f} |"
        in final
    )


def test_the_best_is_bold_and_the_methods_not_resolved_below_it_are_marked(tmp_path):
    problems = 40
    best = [3] * problems  # 75 %
    close = [2] + [3] * (problems - 1)  # one sample fewer on one problem of one seed: not resolved
    far = [1] * problems  # 25 % on every problem: resolved (a zero-width interval at -50)
    records = []
    for seed in (1, 2):
        records += [_record("grpo", seed, {0: far, 8: far})]
        records += [_record("agro", seed, {0: far, 8: close if seed == 1 else best})]
        records += [_record("ggpo", seed, {0: far, 8: best})]
    markdown = _tables(records, ["grpo", "agro", "ggpo"], tmp_path)
    assert "| 8 | 25.00 ± 0.00 | 74.69 ± 0.44 † | **75.00 ± 0.00** |" in markdown
    assert "| 0 | **25.00 ± 0.00** | 25.00 ± 0.00 † | 25.00 ± 0.00 † |" in markdown
    assert "**Bold**: the highest mean in the row; †: not resolved below it" in markdown
    assert "judged in the family of the 3 pairs of methods here, Holm" in markdown
    with (tmp_path / "table.csv").open() as handle:
        rows = {(r["table"], r["update"], r["method"]): r for r in csv.DictReader(handle)}
    assert rows["accuracy", "8", "grpo"]["verdict"] == "resolved"
    assert (rows["accuracy", "8", "grpo"]["versus"], rows["accuracy", "8", "grpo"]["difference"]) == (
        "ggpo",
        "-50.0",
    )
    assert rows["accuracy", "8", "agro"]["verdict"] == "not resolved"
    assert rows["accuracy", "8", "ggpo"]["versus"] == ""  # the best itself


def test_a_ten_point_difference_is_resolved_and_equal_methods_are_not(tmp_path):
    # 500 problems × 8 samples × 3 seeds: GGPO is 10 points above GRPO; AGRO is drawn like GRPO.
    curves = {"grpo": {0: 0.4, 10: 0.5}, "agro": {0: 0.4, 10: 0.5}, "ggpo": {0: 0.4, 10: 0.6}}
    markdown = _tables(_simulated(curves, problems=500, test=False), list(curves), tmp_path)
    lines = {
        line.split(" | ")[1]: line for line in markdown.splitlines() if line.startswith("| validation, ")
    }
    assert lines["GRPO − GGPO"].endswith("| resolved |  |")  # nothing more needed
    assert lines["AGRO − GGPO"].endswith("| resolved |  |")
    assert "| not resolved | MDE " in lines["GRPO − AGRO"]
    difference = float(lines["GRPO − GGPO"].split(" | ")[2].split(" ")[0])
    assert -12.5 < difference < -7.5
    assert (
        "Minimum detectable difference of a pair at this size (500 problems × 8 samples × 3 seeds" in markdown
    )


UPDATES = (0, 8, 16, 24, 32, 40)
PAPER_LIKE = {  # GGPO highest from 2/5 of the run on; GRPO flat at the base model; the others rise and fall
    "grpo": dict.fromkeys(UPDATES, 0.35),
    "grpo-tis": dict(zip(UPDATES, (0.35, 0.5, 0.6, 0.62, 0.5, 0.42), strict=True)),
    "agro": dict(zip(UPDATES, (0.35, 0.5, 0.58, 0.6, 0.5, 0.45), strict=True)),
    "ggpo": dict(zip(UPDATES, (0.35, 0.6, 0.75, 0.8, 0.77, 0.72), strict=True)),
}


def _claims(markdown: str) -> dict[str, str]:
    """Each claim's line by its key ("a", "b", "c every", "c least", "d")."""
    found = {}
    for line in markdown.splitlines():
        if line.startswith("- (c) Every"):
            found["c every"] = line
        elif line.startswith("- (c) GGPO declines least"):
            found["c least"] = line
        elif line.startswith("- ("):
            found[line[3]] = line
    return found


def test_the_papers_claims_get_verdicts_with_intervals(tmp_path):
    markdown = _tables(_simulated(PAPER_LIKE), list(PAPER_LIKE), tmp_path)
    claims = _claims(markdown)
    assert claims["a"].startswith(
        "- (a) GGPO is the highest from 2/5 of the run on (paper: every evaluation from update 160 of 400):"
        " **resolved** [18] — weakest GGPO − GRPO+TIS at validation update 16: +"
    )
    # (a) reads validation from 2/5 of the run (update 16 of 40) on, then test at both checkpoints.
    nested = [
        line.split(":")[0] for line in markdown.splitlines() if line.startswith("  - ") and "vs AGRO" in line
    ]
    assert nested[:6] == [
        "  - validation update 16",
        "  - validation update 24",
        "  - validation update 32",
        "  - validation update 40",
        "  - test, selected checkpoint",
        "  - test, final checkpoint",
    ]
    assert (
        "**resolved** [3] that every other method ends above GRPO (each − GRPO at validation update 40:"
        in claims["b"]
    )
    assert "(no move detected)" in claims["b"] and "; GRPO − base model " in claims["b"]
    assert "seed 42 0.01–0.0139 (last 0.0139)" in claims["b"]
    assert (
        "**not resolved** [4] on the test (selected − final checkpoint) declines" in claims["c every"]
    )  # GRPO
    grpo_tis = next(line for line in markdown.splitlines() if line.startswith("  - GRPO+TIS: peak"))
    assert "at update 24, final" in grpo_tis and grpo_tis.endswith("resolved.")
    assert "; test decline (selected − final) +" in grpo_tis
    # GGPO falls 8 points, GRPO+TIS and AGRO 12–20, GRPO not at all: GGPO declines less than GRPO+TIS, more
    # than GRPO; with 3 seeds (t on 2 df) and Holm over the 3, not every one is resolved below 0, and GRPO's
    # +6.65 is not resolved above it.
    assert claims["c least"].startswith(
        "- (c) GGPO declines least: **not resolved** [3] — GGPO's test decline − each other method's:"
        " vs GRPO +"
    )
    assert claims["d"].startswith(
        "- (d) GRPO+TIS ≥ GRPO at mid-training (paper: 57.93 vs 38.36 at update 160 of 400): at validation"
        " update 16, GRPO+TIS − GRPO +"
    )  # 16 and 24 are equally near 40/2: the earlier one
    assert claims["d"].endswith("**resolved**.")
    assert "holds" not in markdown


def test_claims_against_the_paper_and_within_noise(tmp_path):
    curves = {
        "grpo": dict(zip(UPDATES, (0.35, 0.45, 0.5, 0.5, 0.5, 0.5), strict=True)),
        "grpo-tis": dict(zip(UPDATES, (0.35, 0.45, 0.5, 0.5, 0.5, 0.5), strict=True)),  # drawn like GRPO
        "ggpo": dict(zip(UPDATES, (0.35, 0.5, 0.3, 0.25, 0.2, 0.2), strict=True)),  # collapses
    }
    claims = _claims(_tables(_simulated(curves), list(curves), tmp_path))
    assert "**resolved against** [12] — weakest GGPO − GRPO" in claims["a"]
    assert "GGPO resolved below GRPO at 5 of 6, GRPO+TIS at 5 of 6 places" in claims["a"]
    assert (
        "**resolved against** [2] that every other method ends above GRPO" in claims["b"]
    )  # GGPO ends below
    assert "(moved)" in claims["b"]
    assert claims["c least"].startswith("- (c) GGPO declines least: **resolved against**")
    assert claims["d"].endswith("**not resolved**.")


def test_a_claim_whose_methods_were_not_run_is_left_out(tmp_path):
    records = _simulated(PAPER_LIKE, problems=50)
    without_ggpo = _claims(
        _tables([r for r in records if r.method in ("grpo", "agro")], ["grpo", "agro"], tmp_path)
    )
    assert set(without_ggpo) == {"b", "c every"}
    only_ggpo_agro = [r for r in records if r.method in ("agro", "ggpo")]
    assert set(_claims(_tables(only_ggpo_agro, ["agro", "ggpo"], tmp_path))) == {"a", "c every", "c least"}
    alone = _tables([r for r in records if r.method == "grpo"], ["grpo"], tmp_path)
    assert set(_claims(alone)) == {"b", "c every"} and "### Pairwise" not in alone


def test_counts_round_trip_and_recompute_the_tables_byte_for_byte(tmp_path):
    records = _simulated(PAPER_LIKE, problems=30)
    (tmp_path / "written").mkdir()
    counts = write_report(records, list(PAPER_LIKE), list(SEEDS), tmp_path / "written").counts
    again = Counts.read(tmp_path / "written" / COUNTS_FILE)
    assert again == counts
    assert again.selected[("ggpo", 42)] == records[-3].result.selected_update
    assert again.drift[("grpo", 1234)][-1] == (39, 0.0139)
    with (tmp_path / "written" / DIAGNOSTICS_FILE).open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == sum(len(r.metrics) for r in records)
    last = next(r for r in rows if (r["method"], r["seed"], r["update"]) == ("grpo", "1234", "39"))
    assert float(last["mismatch/drift"]) == pytest.approx(0.0139) and last["mismatch/ess"] == ""  # not logged
    agro_1234 = records[7].tests[40].benchmarks["arith-test"].counts
    assert again.matrix("agro", "test", "arith-test", 40)[1].tolist() == list(agro_1234.values())
    for name in FIGURES:
        assert (tmp_path / "written" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "recomputed").mkdir()
    write_tables(again, tmp_path / "recomputed")
    for name in ("table.md", "table.csv"):
        assert (tmp_path / "recomputed" / name).read_bytes() == (tmp_path / "written" / name).read_bytes()
    header = (tmp_path / "written" / COUNTS_FILE).read_text().splitlines()
    assert header[1] == ' "format": "ggpo-offline counts 1",'
    assert sum(line.startswith('  {"method"') for line in header) == 4 * 3 * (6 + 2)  # validation + 2 test


@pytest.mark.parametrize("folder", ["docs/demo", "docs/beyond", "docs/arc"])
def test_committed_reports_are_recomputed_from_their_counts(folder, tmp_path):
    report = REPO / folder
    if not (report / COUNTS_FILE).is_file():
        pytest.skip(f"{folder} has no {COUNTS_FILE} yet (committed before raw counts were kept)")
    write_tables(Counts.read(report / COUNTS_FILE), tmp_path)
    assert (tmp_path / "table.md").read_text() == (report / "table.md").read_text()
    assert (tmp_path / "table.csv").read_text() == (report / "table.csv").read_text()


def test_runs_that_cannot_be_compared_problem_by_problem_are_refused():
    good = [_record("grpo", 1, {0: [1, 2], 4: [2, 2]}), _record("ggpo", 1, {0: [1, 2], 4: [3, 2]})]
    Counts.from_records(good, ["grpo", "ggpo"], [1])
    with pytest.raises(
        UserError,
        match=r"not all evaluated at the same validation updates \(grpo-s1: \[0, 4\], ggpo-s1: \[0\]\)",
    ):
        Counts.from_records([good[0], _record("ggpo", 1, {0: [1, 2]})], ["grpo", "ggpo"], [1])
    other = _record("ggpo", 1, {0: [1, 2], 4: [3, 2]})
    other.evals[4] = _scored({"arith-validation": {"p0": 1, "q1": 2}}, 4, (1, 4))
    with pytest.raises(
        UserError, match="ggpo-s1 validation update 4: arith-validation was evaluated on other problems"
    ):
        Counts.from_records([good[0], other], ["grpo", "ggpo"], [1])
    tested = _record("grpo", 1, {0: [1, 2], 4: [2, 2]}, tests={4: [1, 1]}, selected=0)
    with pytest.raises(UserError, match="grpo-s1: no test evaluation of its selected update 0"):
        Counts.from_records([tested], ["grpo"], [1])


def test_run_folders_are_read_with_their_validation_and_test_evaluations(tmp_path):
    from ggpo_offline.compare.report import load_run
    from ggpo_offline.train.run_folder import RunFolder

    records = []
    for method, final in (("grpo", [2, 2, 1]), ("ggpo", [4, 3, 3])):
        folder = RunFolder(tmp_path / "runs" / f"{method}-s7")
        for path, counts in (
            (folder.eval_report(0), [1, 1, 1]),
            (folder.eval_report(5), final),
            (folder.test_report(5), final[::-1]),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(
                    _report("arith-test" if "test" in path.parts else "arith-validation", counts).to_dict()
                )
            )
        folder.config_file.write_text("{}")
        folder.result_file.write_text(json.dumps({"selected_update": 5, "pool_fingerprint": "p"}))
        folder.metrics_file.write_text(json.dumps({"update": 0, "mismatch/drift": 0.0123456789}) + "\n")
        records.append(load_run(folder.path, method, 7))
    assert sorted(records[0].evals) == [0, 5] and sorted(records[0].tests) == [5]
    (tmp_path / "report").mkdir()
    counts = write_report(records, ["grpo", "ggpo"], [7], tmp_path / "report").counts
    assert counts.correct["ggpo", 7, "test", 5] == {"arith-test": (3, 3, 4)}
    assert counts.selected == {("grpo", 7): 5, ("ggpo", 7): 5}
    assert counts.drift["grpo", 7] == ((0, 0.0123457),)  # 6 significant digits
    markdown = (tmp_path / "report" / "table.md").read_text()
    # One seed: no verdict about the learners, so GRPO is not resolved below GGPO (too few seeds).
    assert (
        "| GRPO | 5 | 41.67 † | 41.67 † |" in markdown and "| GGPO | 5 | **83.33** | **83.33** |" in markdown
    )


def _arith_record(method: str, test_counts: list[int], selected: int = 10, seed: int = 42) -> RunRecord:
    """One seed's run on 4 flat (level 1) and 6 nested (level 4) arith test problems, n = 8."""
    ids = [f"arith-L1-{i:012x}" for i in range(4)] + [f"arith-L4-{i:012x}" for i in range(4, 10)]

    def report(split: str, counts: list[int]) -> EvalReport:
        return _scored({f"arith-{split}": dict(zip(ids, counts, strict=True))}, 8, (1,))

    base = [4] * 10
    return RunRecord(
        method=method,
        seed=seed,
        run_dir=Path(f"runs/{method}-s{seed}"),
        settings=RunSettings({}),
        result=RunResult(pool_fingerprint="pool", data_order_fingerprint="plan", selected_update=selected),
        evals={0: report("validation", base), selected: report("validation", test_counts)},
        metrics=[],
        tests={0: report("test", base), selected: report("test", test_counts)},
    )


STYLES_REPORT = {
    "n_problems": 256,
    "split": "validation",
    "m": 8,
    "forced_by_class": {
        "careful": {"flat": 0.2, "nested": 0.7},
        "quick": {"flat": 0.9, "nested": 0.3},
        "draft": {"flat": 0.0, "nested": 0.0},
    },
}


def test_the_ceilings_section_sets_each_method_against_both_ceilings_per_prompt_class():
    from ggpo_offline.compare.against_ceilings import ceilings_section
    from ggpo_offline.compare.scores import Scores

    grpo = _arith_record("grpo", [8] * 4 + [2] * 6)  # flat 100 %, nested 25 %: 55 % in all
    ggpo = _arith_record("ggpo", [8] * 10)
    runs = [
        grpo,
        ggpo,
        _arith_record("grpo", [8] * 4 + [3] * 6, seed=7),
        _arith_record("ggpo", [8] * 10, seed=7),
    ]
    counts = Counts.from_records(runs, ["grpo", "ggpo"], [42, 7])
    lines = markdown_text(ceilings_section(Scores(counts), ["grpo", "ggpo"], STYLES_REPORT)).split("\n")
    # flat share 0.4: prompt-blind = max(careful .4*20 + .6*70 = 50, quick .4*90 + .6*30 = 54); aware 36 + 42
    assert "reaches at most the **prompt-blind ceiling**, 54.00 (quick everywhere)" in lines[2]
    assert "**prompt-aware ceiling**, 78.00 (quick on flat: 90.0, careful on nested: 70.0)" in lines[2]
    assert lines[4] == (
        "| method | update | flat (4) | nested (6) | mean@8 | − prompt-blind ceiling [95 % CI] |"
        " verdict (Holm over 2) |"
    )
    assert lines[6] == "| base model | 0 | 50.00 | 50.00 | 50.00 | -4.00 [-4.00, -4.00] |  |"
    # GRPO: 55 and 62.5 on the two seeds (+1 and +8.5 over the ceiling), 10 problems that differ: on 1 df
    assert lines[7].startswith("| GRPO | 10 | 100.00 | 31.25 | 58.75 | +4.75 [")
    assert lines[7].endswith("| not resolved |")
    assert lines[8] == "| GGPO | 10 | 100.00 | 100.00 | 100.00 | +46.00 [+46.00, +46.00] | resolved |"
    assert lines[-2] == "Resolved above the prompt-blind ceiling (Holm over the 2 methods): GGPO."
    one_seed = Counts.from_records([grpo], ["grpo"], [42])
    alone = markdown_text(ceilings_section(Scores(one_seed), ["grpo"], STYLES_REPORT)).split("\n")
    assert alone[-2] == (
        "No method ends resolved above the prompt-blind ceiling (54.00; one seed: too few seeds for a"
        " verdict). The best, GRPO, ends at 55.00: flat 100.0 against quick's 90.0, nested 25.0 against"
        " careful's 70.0."
    )


def test_the_files_and_the_terminal_show_one_computed_report_never_read_back(tmp_path, monkeypatch, capsys):
    from ggpo_cli import terminal

    from ggpo_offline.compare.comparison import CompareResult
    from ggpo_offline.compare.report import compute_report

    runs = [
        _arith_record(m, c, seed=s)
        for s in (42, 7)
        for m, c in (("grpo", [8] * 4 + [2] * 6), ("ggpo", [8] * 10))
    ]
    report = compute_report(Counts.from_records(runs, ["grpo", "ggpo"], [42, 7]), STYLES_REPORT)
    assert report.table_md.startswith("### Validation accuracy")
    assert markdown_text(report.ceilings).startswith("### Against")
    with monkeypatch.context() as guard:
        refuse_reading_back(guard, tmp_path)
        with pytest.raises(AssertionError, match="table.md was read back"):  # the guard works
            (tmp_path / "table.md").read_text()
        report.write(tmp_path)
        terminal.print_compare_result(
            CompareResult(tmp_path, runs, {42: "plan", 7: "plan"}, None, {}, report)
        )
    printed = capsys.readouterr().out
    assert (tmp_path / "table.md").read_text() == report.table_md and report.table_md in printed
    assert (tmp_path / "ceilings.md").read_text() == markdown_text(report.ceilings)
    with (tmp_path / "table.csv").open() as handle:
        assert tuple(csv.DictReader(handle)) == tuple({k: str(v) for k, v in r.items()} for r in report.rows)
    without = compute_report(report.counts)  # without --ceilings: no ceilings.md, not an old one
    without.write(tmp_path)
    assert not (tmp_path / "ceilings.md").exists() and without.tables == report.tables


def test_a_ceilings_file_that_is_not_a_forced_measure_is_refused_in_one_line(tmp_path):
    from ggpo_offline.compare.comparison import read_ceilings
    from ggpo_offline.core.errors import UserError

    free_only = tmp_path / "free.json"
    free_only.write_text(json.dumps({"accuracy": 0.4, "forced": {}, "forced_by_class": {}}))
    with pytest.raises(UserError, match=r"^--ceilings .*free.json: not a `ggpo measure-styles --json`"):
        read_ceilings(free_only)
    with pytest.raises(
        UserError, match=r"^--ceilings .*absent.json: cannot read it as JSON \(.*No such file"
    ):
        read_ceilings(tmp_path / "absent.json")
    (tmp_path / "styles.json").write_text(json.dumps(STYLES_REPORT))
    assert read_ceilings(tmp_path / "styles.json") == STYLES_REPORT and read_ceilings(None) is None


def test_ggpo_report_recomputes_a_committed_report_from_its_counts(tmp_path):
    from test_cli import assert_one_error_line, ggpo_here

    from ggpo_offline.compare.config import RefreshConfig
    from ggpo_offline.compare.render_folder import render_folder
    from ggpo_offline.compare.report import STATISTICS

    committed, folder = REPO / "docs" / "demo", tmp_path / "demo"
    shutil.copytree(committed, folder)
    # The report as an older version left it: other tables and statistics, in the files and the README.
    readme = (folder / "README.md").read_text()
    for name in ("table.md", "ceilings.md"):
        old = f"### {name}, as an older version wrote it\n"
        readme = readme.replace((folder / name).read_text(), old)
        (folder / name).write_text(old)
    (folder / "README.md").write_text(readme.replace(STATISTICS, "The bootstrap of an older version."))
    (folder / "table.csv").write_text("table\n")
    assert_one_error_line(
        ggpo_here("report", "--folder", str(folder)), "has ceilings.md: give --ceilings FILE"
    )
    assert (folder / "table.csv").read_text() == "table\n"  # refused before anything was written
    render_folder(RefreshConfig(folder=folder, ceilings=CEILINGS))
    for name in ("README.md", "table.md", "table.csv", "ceilings.md", COUNTS_FILE, "figure.png"):
        assert (folder / name).read_bytes() == (committed / name).read_bytes(), name


def test_each_family_of_the_committed_arc_report_is_holm_adjusted_as_one():
    # A complete family: the pairwise table at one place, the Table 5 declines, each claim's set. Holm over
    # each gives the p_holm column and its verdicts; a ranked row or column shows only the comparisons with
    # its best, judged in the family of every pair (10 for five methods). In this report the families turn
    # some comparisons whose own p is below 0.05 into "not resolved".
    with (REPO / "docs" / "arc" / "table.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["p_value"]]
    families: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["table"] in ("accuracy", "end", "matched_drift"):
            assert row["family"] == "10"
        elif row["table"] == "pairwise":
            families.setdefault((row["table"], row["split"], row["checkpoint"]), []).append(row)
        else:  # decline, claim a-d: a claim's rows of one size are one family (claim b: moved [1], below)
            families.setdefault((row["table"], row["family"]), []).append(row)
    assert len(families) == 3 + 1 + 6 + 2  # places; declines; a, b (2), c (2), d; a and d at matched drift
    turned = 0
    for key, family in families.items():
        adjusted = holm([float(r["p_value"]) for r in family])
        for row, p_holm in zip(family, adjusted, strict=True):
            assert float(row["p_holm"]) == pytest.approx(p_holm, rel=1e-3, abs=1e-4), key
            assert int(row["family"]) == len(family), key
            turned += float(row["p_value"]) < 0.05 <= float(row["p_holm"])
    for row in rows:
        assert row["verdict"] == ("resolved" if float(row["p_holm"]) < 0.05 else "not resolved")
    assert turned > 0
