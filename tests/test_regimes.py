"""`ggpo regimes-report`: each correction against no correction within each condition, one Holm family a
condition, with the condition's measured mismatch and lag and each method's ESS and masked share; on counts
and diagnostics whose answers are known."""

from types import SimpleNamespace

import pytest
from test_cli import assert_one_error_line, ggpo_here
from test_ladder import SEEDS, _counts

from ggpo_offline.compare.config import RefreshConfig
from ggpo_offline.compare.counts import Counts
from ggpo_offline.compare.regimes import Regimes
from ggpo_offline.compare.render_folder import render_folder
from ggpo_offline.compare.report import write_diagnostics
from ggpo_offline.compare.score_tables import display
from ggpo_offline.train.metric_names import AGE, MISMATCH_ESS, MISMATCH_K3
from ggpo_offline.train.run_records import RunSettings
from ggpo_offline.train.sampler_mismatch import SamplerMismatch

CORRECTION = "openrlhf-icepop"


def _condition(folder, counts: Counts, dose: float, age: int) -> None:
    """A compare's files: its counts, and diagnostics.csv as its report writes it from runs that logged
    the pool's mismatch ``dose`` at update 0, the lag ``age`` at every update, an ESS and (the correction)
    a masked share."""
    folder.mkdir(parents=True)
    counts.write(folder / "counts.json")
    measured = SamplerMismatch(dose, dose / 2, dose / 3, 1 + dose, 1 - dose, 1.0, 1.0, 1.0, dose / 10, 8, 80)
    runs = [
        SimpleNamespace(
            method=method,
            seed=seed,
            settings=RunSettings({"method": method, "seed": seed}),
            metrics=[
                {"update": u, AGE: float(age + u % 2), MISMATCH_ESS: 1 - dose * (u + 1)}
                | {MISMATCH_K3: dose * (age + u % 2) * (1 if method == "grpo" else 100)}
                | (measured.metrics() if u == 0 else {})
                | ({"correction/masked_frac": dose * seed} if method == CORRECTION else {})
                for u in range(4)
            ],
        )
        for method in counts.methods
        for seed in counts.seeds
    ]
    write_diagnostics(runs, folder / "diagnostics.csv")


@pytest.fixture
def conditions(tmp_path):
    _condition(tmp_path / "control", _counts({"grpo": 0, CORRECTION: 0}, falls=False), dose=0.0, age=0)
    _condition(tmp_path / "dose", _counts({"grpo": 0, CORRECTION: 12}, falls=False), dose=0.03, age=2)
    return tmp_path


def test_each_condition_sets_every_correction_against_none_with_its_measured_dose_and_lag(conditions):
    out = conditions / "out"
    given = f"control={conditions / 'control'},τ 1.4={conditions / 'dose'}"
    result = ggpo_here("regimes-report", "--conditions", given, "--out", str(out))
    assert result.returncode == 0, result.stderr
    regimes = Regimes.read(out)
    assert regimes.seeds == list(SEEDS) and regimes.baseline == "grpo"
    control, dose = regimes.conditions["control"], regimes.conditions["τ 1.4"]

    # Under the dose the correction has every problem at 2/2 where GRPO has the base grid, in every seed.
    base = _counts({"grpo": 0}, falls=False).matrix("grpo", "test", "arith", 10)
    expected = (2 - base).sum() / base.size * 100 / 2
    found = dose.against_baseline[CORRECTION]
    assert found.difference.mean == pytest.approx(expected) and found.difference.verdict == "resolved"
    assert found.better and abs(found.mean - dose.baseline_mean - expected) < 1e-9
    nothing = control.against_baseline[CORRECTION]
    assert nothing.difference.number().text() == "+0.00 [+0.00, +0.00] not resolved" and not nothing.better
    assert "grpo" not in dose.against_baseline  # the baseline is not set against itself

    # The condition as its runs measured it: the dose at update 0, the mean age over every update.
    assert dose.measured["sampler/abs_log_ratio"] == 0.03 and control.measured["sampler/k3"] == 0.0
    assert dose.measured["age_mean"] == 2.5 and dose.measured["age_max"] == 3.0
    # The K3 the baseline trained on, its runs' alone: the dose's mismatch grown with the samples' age.
    assert dose.measured["trained_k3"] == pytest.approx(0.03 * 2.5)
    assert dose.diagnostics[CORRECTION]["masked"] == pytest.approx(0.03 * sum(SEEDS) / len(SEEDS))
    assert dose.diagnostics["grpo"] == {"ess": pytest.approx(1 - 0.03 * 2.5)}  # masks nothing

    readme = (out / "README.md").read_text()
    assert f"- τ 1.4: {display(CORRECTION)} ({expected:+.2f}) resolved above GRPO\n" in readme
    assert "- control: none resolved above GRPO\n" in readme
    assert "one Holm family per condition" in readme
    # The README is rendered from the data: ggpo report writes it again from regimes.json and report.json.
    (out / "README.md").write_text("# edited\n")
    render_folder(RefreshConfig(folder=out))
    assert (out / "README.md").read_text() == readme


def test_refusals_are_one_line(conditions):
    given = f"control={conditions / 'control'}"
    cases = [
        (["--conditions", str(conditions / "control")], "is not NAME=FOLDER"),
        (["--conditions", f"x={conditions / 'none'}"], "has no counts.json: give the folder of a finished"),
        (["--conditions", given, "--baseline", "ggpo"], "--baseline ggpo was not trained under control"),
    ]
    for flags, words in cases:
        assert_one_error_line(ggpo_here("regimes-report", *flags, "--out", str(conditions / "out")), words)
