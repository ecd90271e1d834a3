"""`ggpo tune-report` and the presets' rates per learner: each learner's rate is the one whose run peaks
highest on validation, the report comes back from its JSON alone, and a preset gives each learner its own."""

import json
from pathlib import Path

import numpy as np
import pytest
from test_arc import BASE, TRAIN_SETTINGS, _part, _write_run
from test_cli import assert_one_error_line, ggpo, ggpo_here

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import markdown_text
from ggpo_offline.compare.config import TuneConfig
from ggpo_offline.compare.score_tables import rate_text
from ggpo_offline.compare.tuning import TUNING_FILE, Sweep, chosen_rates, tune_report, tuning_tables
from ggpo_offline.core.errors import UserError
from ggpo_offline.train.learners import LEARNERS, TUNED_LR, PerLearner
from ggpo_offline.train.training_presets import PRESETS, resolve_config

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
    """One compare report per rate, as `make tune-lr` writes them; keys (method, lr) are seed 42's runs,
    (method, lr, seed) any seed's."""
    keyed = {key if len(key) == 3 else (*key, 42): evals for key, evals in sweep.items()}
    parts = []
    for rate in sorted({lr for _, lr, _ in keyed}):
        folder = root / f"lr{rate_text(rate)}"
        runs = {}
        for (method, lr, seed), evals in keyed.items():
            if lr == rate:
                own = {
                    "ref_refresh": None if method == "grpo" else 8
                }  # a learner's own: not the sweep's; config.json holds the fingerprints too
                run = {"method": method, "lr": lr, "seed": seed, "pool": "p", "out": "x"}
                run |= {"pool_fingerprint": "pool", "data_order_fingerprint": f"plan-{seed}"}
                config = TRAIN_SETTINGS | run | own | (extra or {})
                name = f"{method}-s{seed}"
                runs[name] = _write_run(folder / "runs" / name, seed, evals, config)
        parts.append(str(_part(folder, runs)))
    return tuple(parts)


def test_each_learner_gets_the_rate_whose_run_peaks_highest_and_the_report_comes_back_from_its_json(tmp_path):
    out = tune_report(TuneConfig(parts=_sweep_parts(tmp_path), out=tmp_path / "tuning"))
    stored = json.loads((out / TUNING_FILE).read_text())
    assert stored["format"] == 2
    sweep = Sweep.read(out)
    later = tmp_path / "later"
    later.mkdir()
    (later / TUNING_FILE).write_text(json.dumps({**stored, "format": 3}))
    with pytest.raises(UserError, match=r"tuning.json has format 3; this ggpo-offline reads format 1, 2$"):
        Sweep.read(later)
    assert chosen_rates(sweep) == {"grpo": 3e-4, "ggpo": 1e-4}
    assert sweep.seeds == [42] and sweep.runs["grpo"]["3e-4"]["42"]["4"] == {f"p{i}": 7 for i in range(8)}
    readme = (out / "README.md").read_text()
    assert markdown_text(tuning_tables(sweep)) in readme  # the tables are recomputed from tuning.json alone
    assert "seeds 42, U = 8 updates of G = 4 groups, validation 4 problems × 8 every 4 updates" in readme
    assert (
        "| GRPO | 37.50 (4) | 62.50 (8) | **87.50 (4)** | 3e-4 (grid edge) | − 1e-4: +25.00 [+25.00, +25.00]"
        " too few seeds |" in readme  # one seed: a choice made on validation, not a finding
    )
    assert "the choice is only the higher mean" in readme
    assert "| GGPO | – | **56.25 (8)** | 56.25 (4) | 1e-4 | − 3e-4: +0.00 [" in readme
    assert "| GGPO | 3e-4 | 25.00 | 56.25 | 25.00 |" in readme  # every evaluation, by update
    diagnostics = (out / "diagnostics.csv").read_text().splitlines()
    assert diagnostics[0].startswith("method,seed,lr,update,mismatch/drift,")
    assert len(diagnostics) == 1 + len(SWEEP)  # one logged update per run here
    assert "grpo,42,3e-05,0,0.01,,,,,,," in diagnostics
    assert readme.count("too few seeds |") == 2 and "resolved |" not in readme


BASE8 = [2] * 8
SEEDED = {  # three seeds; each run's own selected checkpoint (update) in the comments
    ("grpo", 1e-4, 42): {0: BASE8, 4: [3] * 8, 8: [4] * 8},  # 8: 50.00
    ("grpo", 1e-4, 1234): {0: BASE8, 4: [5] * 8, 8: [3] * 8},  # 4: 62.50
    ("grpo", 1e-4, 2027): {0: BASE8, 4: [4] * 8, 8: [4, 4, 4, 4, 5, 5, 5, 5]},  # 8: 56.25
    ("grpo", 3e-4, 42): {0: BASE8, 4: [7] * 8, 8: [6] * 8},  # 4: 87.50
    ("grpo", 3e-4, 1234): {0: BASE8, 4: [7, 6] * 4, 8: [1] * 8},  # 4: 81.25
    ("grpo", 3e-4, 2027): {0: BASE8, 4: [6] * 8, 8: [7] * 7 + [8]},  # 8: 89.06
    ("ggpo", 1e-4, 42): {0: BASE8, 4: [4] * 8, 8: [5] * 8},  # 8: 62.50
    ("ggpo", 1e-4, 1234): {0: BASE8, 4: [3] * 8, 8: [3] * 4 + [4] * 4},  # 8: 43.75
    ("ggpo", 1e-4, 2027): {0: BASE8, 4: [5] * 8, 8: [4] * 8},  # 4: 62.50
    ("ggpo", 3e-4, 42): {0: BASE8, 4: [3] * 8, 8: [4] * 8},  # 8: 50.00
    ("ggpo", 3e-4, 1234): {0: BASE8, 4: [5] * 8, 8: [2] * 8},  # 4: 62.50
    ("ggpo", 3e-4, 2027): {0: BASE8, 4: [4] * 8, 8: [4] * 4 + [3] * 4},  # 4: 50.00
}


def _selected_rows(method, lr, updates):
    """The hand-picked selected checkpoint's counts of each seed, in the sweep's seed order."""
    return np.array(
        [SEEDED[(method, lr, seed)][u] for seed, u in zip((42, 1234, 2027), updates, strict=True)]
    )


def test_with_seeds_each_run_selects_its_own_checkpoint_and_the_margins_are_one_calibrated_family(tmp_path):
    out = tune_report(TuneConfig(parts=_sweep_parts(tmp_path, SEEDED), out=tmp_path / "tuning"))
    sweep = Sweep.read(out)
    assert sweep.seeds == [42, 1234, 2027] and "seed" not in sweep.settings
    assert chosen_rates(sweep) == {"grpo": 3e-4, "ggpo": 1e-4}
    # Paired by seed and problem at each run's own checkpoint; both learners' margins form one Holm family.
    grpo, ggpo = stats.judge([
        stats.difference(_selected_rows("grpo", 3e-4, (4, 4, 8)), _selected_rows("grpo", 1e-4, (8, 4, 8)), 8),
        stats.difference(_selected_rows("ggpo", 1e-4, (8, 8, 4)), _selected_rows("ggpo", 3e-4, (8, 4, 4)), 8),
    ])  # fmt: skip
    # GRPO's margin excludes 0 alone (p 0.034) but not after Holm over the two learners (p 0.067).
    assert grpo.interval.verdict == "resolved" and grpo.p_holm == pytest.approx(2 * grpo.interval.p_value)
    assert grpo.verdict == "not resolved" and ggpo.verdict == "not resolved"
    readme = (out / "README.md").read_text()
    assert markdown_text(tuning_tables(sweep)) in readme and "seeds 42, 1234, 2027, U = 8 updates" in readme
    assert f"| GRPO | 56.25 (8/4/8) | **85.94 (4/4/8)** | 3e-4 | − 1e-4: {grpo.text()} |" in readme
    assert f"| GGPO | **56.25 (8/8/4)** | 54.17 (8/4/4) | 1e-4 | − 3e-4: {ggpo.text()} |" in readme
    assert "| GRPO | 1e-4 | 25.00 | 50.00 | 47.92 |" in readme  # every evaluation, mean over seeds
    incomplete = {key: evals for key, evals in SEEDED.items() if key != ("ggpo", 3e-4, 2027)}
    with pytest.raises(UserError, match="^ggpo at lr 3e-4 has no finished run of seed 2027$"):
        tune_report(TuneConfig(parts=_sweep_parts(tmp_path / "b", incomplete), out=tmp_path / "t"))


def test_a_sweep_that_is_not_one_varying_rate_is_refused(tmp_path):
    parts = _sweep_parts(tmp_path / "a")
    with pytest.raises(UserError, match="^grpo at lr 3e-4, seed 42 is in two of the parts$"):
        tune_report(TuneConfig(parts=(*parts, parts[-1]), out=tmp_path / "t"))
    other = _sweep_parts(tmp_path / "b", {("grpo", 1e-5): SWEEP[("grpo", 3e-5)]}, {"updates": 9})
    with pytest.raises(UserError, match=r"differ in more than learner, lr and seed \(updates\)$"):
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
    for method in LEARNERS:  # the core learners and the framework presets; an ablation at its learner's rate
        expected = TUNED_LR.chosen.get(LEARNERS[method].ablates or method, TUNED_LR.default)
        assert resolve_config("tiny", None, method=method).lr == expected, method
        assert resolve_config("arc", None, method=method).lr == expected, method
    assert resolve_config("tiny", None, method="ggpo", lr=1e-3).lr == 1e-3
    assert resolve_config("paper-offline", None, method="ggpo").lr == 1e-6  # SPEC's paper default
    ablation = resolve_config("arc", None, method="ggpo-bounded-push")
    assert ablation.lr == TUNED_LR.of("ggpo") != TUNED_LR.default
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
    assert str(rates) == "per learner (docs/tuning, docs/corrections/tuning), else 0.0003"


def test_the_presets_rates_are_the_ones_the_committed_sweeps_chose():
    """`make tune-lr` (docs/tuning) and `make tune-corrections` (docs/corrections/tuning) each tune their
    learners once; TUNED_LR holds both choices and nothing else."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    chosen: dict[str, float] = {}
    for folder in (docs / "tuning", docs / "corrections" / "tuning"):
        sweep = Sweep.read(folder)  # committed as format 1: no "format" key
        assert not chosen.keys() & chosen_rates(sweep).keys(), folder
        chosen |= chosen_rates(sweep)
        assert markdown_text(tuning_tables(sweep)) in (folder / "README.md").read_text()
        assert len(sweep.seeds) >= 2 and sweep.settings["updates"] == PRESETS["tiny"]["updates"]
    assert chosen == TUNED_LR.chosen
