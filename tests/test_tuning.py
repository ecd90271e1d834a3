"""`ggpo tune-report` and the presets' rates per learner: each learner's rate is the one whose run peaks
highest on validation, the report comes back from its JSON alone, and a preset gives each learner its own."""

import json
from pathlib import Path

import pytest
from test_arc import BASE, TRAIN_SETTINGS, _part, _write_run
from test_cli import assert_one_error_line, ggpo, ggpo_here

from ggpo_offline.compare.config import TuneConfig
from ggpo_offline.compare.tables import rate_text
from ggpo_offline.compare.tuning import TUNING_FILE, chosen_rates, tune_report, tuning_tables
from ggpo_offline.core.errors import UserError
from ggpo_offline.train.config import PRESETS, TUNED_LR, PerLearner, resolve_config
from ggpo_offline.train.learners import METHODS

SWEEP = {  # validation counts of 8 problems out of 8 at updates 0, 4, 8 (BASE: 4 problems at 25 %)
    # GRPO at 3e-4 peaks highest (87.50 at update 4) and then falls below 1e-4's final: chosen by its peak.
    ("grpo", 3e-5): {0: BASE * 2, 4: [3] * 8, 8: [3] * 8},
    ("grpo", 1e-4): {0: BASE * 2, 4: [4] * 8, 8: [5] * 8},
    ("grpo", 3e-4): {0: BASE * 2, 4: [7] * 8, 8: [1] * 8},
    # GGPO ties at 1e-4 and 3e-4 (56.25 each, on different problems): the smaller rate.
    ("ggpo", 1e-4): {0: BASE * 2, 4: [2] * 8, 8: [1, 7, 2, 6, 3, 5, 4, 8]},
    ("ggpo", 3e-4): {0: BASE * 2, 4: [8, 4, 5, 3, 6, 2, 7, 1], 8: [2] * 8},
}


def _sweep_parts(root, sweep=SWEEP, extra=None):
    """One compare report per rate, as `make tune-lr` writes them."""
    parts = []
    for rate in sorted({lr for _, lr in sweep}):
        folder = root / f"lr{rate_text(rate)}"
        runs = {}
        for (method, lr), evals in sweep.items():
            if lr == rate:
                own = {"ref_refresh": None if method == "grpo" else 8}  # a learner's own: not the sweep's
                run = {"method": method, "lr": lr, "seed": 42, "pool": "p", "out": "x"}
                config = TRAIN_SETTINGS | run | own | (extra or {})
                runs[f"{method}-s42"] = _write_run(folder / "runs" / f"{method}-s42", 42, evals, config)
        parts.append(str(_part(folder, runs)))
    return tuple(parts)


def test_each_learner_gets_the_rate_whose_run_peaks_highest_and_the_report_comes_back_from_its_json(tmp_path):
    out = tune_report(TuneConfig(parts=_sweep_parts(tmp_path), out=tmp_path / "tuning"))
    sweep = json.loads((out / TUNING_FILE).read_text())
    assert chosen_rates(sweep) == {"grpo": 3e-4, "ggpo": 1e-4}
    assert sweep["runs"]["grpo"]["3e-4"]["4"] == {f"p{i}": 7 for i in range(8)}
    readme = (out / "README.md").read_text()
    assert tuning_tables(sweep) in readme  # the tables are recomputed from tuning.json alone
    assert "seed 42, U = 8 updates of G = 4 groups, validation 4 problems × 8 every 4 updates" in readme
    assert (
        "| GRPO | 37.50 (4) | 62.50 (8) | **87.50 (4)** | 3e-4 (grid edge) | − 1e-4: +25.00 [+25.00, +25.00]"
        " too few seeds |" in readme  # one seed: a choice made on validation, not a finding
    )
    assert "the higher validation mean, not a resolved difference" in readme
    assert "| GGPO | – | **56.25 (8)** | 56.25 (4) | 1e-4 | − 3e-4: +0.00 [" in readme
    assert "| GGPO | 3e-4 | 25.00 | 56.25 | 25.00 |" in readme  # every evaluation, by update
    diagnostics = (out / "diagnostics.csv").read_text().splitlines()
    assert diagnostics[0].startswith("method,seed,lr,update,mismatch/drift,")
    assert len(diagnostics) == 1 + len(SWEEP)  # one logged update per run here
    assert "grpo,42,3e-05,0,0.01,,,,,,," in diagnostics
    assert readme.count("too few seeds |") == 2 and "resolved |" not in readme


def test_a_sweep_that_is_not_one_varying_rate_is_refused(tmp_path):
    parts = _sweep_parts(tmp_path / "a")
    with pytest.raises(UserError, match="^grpo at lr 3e-4 is in two of the parts$"):
        tune_report(TuneConfig(parts=(*parts, parts[-1]), out=tmp_path / "t"))
    other = _sweep_parts(tmp_path / "b", {("grpo", 1e-5): SWEEP[("grpo", 3e-5)]}, {"updates": 9})
    with pytest.raises(UserError, match=r"differ in more than learner and lr \(updates\)$"):
        tune_report(TuneConfig(parts=(*parts, *other), out=tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_tune_report_on_the_command_line(tmp_path):
    parts = _sweep_parts(tmp_path)
    result = ggpo("tune-report", "--parts", ",".join(parts), "--out", str(tmp_path / "t"))
    assert result.returncode == 0 and f"wrote {tmp_path / 't'}/README.md" in result.stdout
    empty = tmp_path / "empty"
    _part(empty, {})
    result = ggpo_here("tune-report", "--parts", str(empty), "--out", str(tmp_path / "u"))
    assert_one_error_line(result, f"no finished run in {empty}")


def test_a_preset_gives_each_learner_its_tuned_rate_and_a_flag_still_wins():
    for method in METHODS:
        expected = TUNED_LR.chosen.get(method, TUNED_LR.default)
        assert resolve_config("tiny", None, method=method).lr == expected, method
        assert resolve_config("arc", None, method=method).lr == expected, method
    assert resolve_config("tiny", None, method="ggpo", lr=1e-3).lr == 1e-3
    assert resolve_config("paper-offline", None, method="ggpo").lr == 1e-6  # SPEC's paper default
    # A preset value per learner resolves by the learner of this run, not by the first one or a default.
    rates = PerLearner(chosen={"grpo": 1e-4, "ggpo": 3e-5}, default=3e-4)
    PRESETS["per-learner-test"] = {"lr": rates}
    try:
        assert [resolve_config("per-learner-test", None, method=m).lr for m in ("grpo", "ggpo", "agro")] == [
            1e-4,
            3e-5,
            3e-4,
        ]
    finally:
        del PRESETS["per-learner-test"]
    assert str(rates) == "per learner (docs/tuning), else 0.0003"


def test_the_presets_rates_are_the_ones_the_committed_sweep_chose():
    docs = Path(__file__).resolve().parents[1] / "docs" / "tuning"
    sweep = json.loads((docs / TUNING_FILE).read_text())
    assert chosen_rates(sweep) == TUNED_LR.chosen
    assert tuning_tables(sweep) in (docs / "README.md").read_text()
    assert sweep["settings"]["seed"] == 42 and sweep["settings"]["updates"] == PRESETS["tiny"]["updates"]
