"""`ggpo ladder-report`: each rung's runs against the offline runs of the same seed and problems, GGPO's two
claims at each N, the fall after the peak, the rounds' mismatch; on counts whose answers are known."""

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO
from test_cli import assert_one_error_line, ggpo_here

from ggpo_offline.compare.config import RefreshConfig
from ggpo_offline.compare.counts import Counts
from ggpo_offline.compare.ladder import Ladder
from ggpo_offline.compare.render_folder import render_folder
from ggpo_offline.compare.report import write_diagnostics
from ggpo_offline.train.metric_names import MISMATCH_K3, ROUND_INDEX, ROUND_K3
from ggpo_offline.train.run_records import RunSettings

SEEDS = (1, 2, 3)
PROBLEMS = tuple(f"p{i}" for i in range(12))


def _counts(shift: dict[str, int], falls: bool) -> Counts:
    """Two samples per problem; each method of ``shift`` gets ``shift[method]`` more problems fully right than
    the base grid, which differs by seed and problem (runs that differ); with ``falls`` every final evaluation
    loses 2."""
    rng = np.random.default_rng(0)
    base = {seed: rng.integers(0, 3, len(PROBLEMS)) for seed in SEEDS}
    correct = {}
    for method in shift:
        for seed in SEEDS:
            peak = base[seed].copy()
            peak[: shift[method]] = 2
            final = np.maximum(peak - 2, 0) if falls else peak
            for split, update, values in [
                ("validation", 0, base[seed]), ("validation", 10, peak), ("validation", 20, final),
                ("test", 10, peak), ("test", 20, final),
            ]:  # fmt: skip
                correct[(method, seed, split, update)] = {"arith": tuple(int(v) for v in values)}
    return Counts(
        methods=tuple(shift),
        seeds=SEEDS,
        n={"validation": 2, "test": 2},
        ks={"validation": (1,), "test": (1,)},
        prompts={"validation": {"arith": PROBLEMS}, "test": {"arith": PROBLEMS}},
        correct=correct,
        selected={(m, s): 10 for m in shift for s in SEEDS},
        drift={},
    )


def _rung(folder, counts: Counts, sync_every: int, others: tuple[str, ...] = ()) -> None:
    """A synchronised compare's files: its counts, and the diagnostics.csv its report writes from runs that
    logged a round every ``sync_every`` updates (and runs of ``others``, which its counts do not hold)."""
    folder.mkdir(parents=True)
    counts.write(folder / "counts.json")
    runs = [
        SimpleNamespace(
            method=method,
            seed=seed,
            settings=RunSettings({"method": method, "seed": seed, "sync_every": sync_every}),
            metrics=[
                {"update": u, MISMATCH_K3: 0.01 * (u % sync_every)}
                | ({ROUND_INDEX: u // sync_every, ROUND_K3: 0.5} if u % sync_every == 0 else {})
                for u in range(8)
            ],
        )
        for method in (*counts.methods, *others)
        for seed in counts.seeds
    ]
    write_diagnostics(runs, folder / "diagnostics.csv")


def test_the_ladder_pairs_each_rung_with_the_offline_runs_of_its_seeds(tmp_path):
    offline = tmp_path / "offline"
    offline.mkdir()
    _counts({"grpo": 0, "ggpo": 0}, falls=True).write(offline / "counts.json")
    _rung(tmp_path / "sync4", _counts({"grpo": 0, "ggpo": 6}, falls=False), sync_every=4)
    result = ggpo_here(
        "ladder-report",
        "--offline",
        str(offline),
        "--rungs",
        str(tmp_path / "sync4"),
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 0, result.stderr
    ladder = Ladder.read(tmp_path / "out")
    against = ladder.against_offline["N = 4"]
    # GGPO at N = 4 has 6 of 12 problems at 2/2 where offline it had the base grid: its mean rises by the base
    # grid's shortfall on them; GRPO is the same runs on both sides: exactly +0.00.
    base = _counts({"grpo": 0, "ggpo": 0}, falls=False)
    offline_ggpo = base.matrix("ggpo", "test", "arith", 10)
    expected = (2 - offline_ggpo[:, :6]).sum() / offline_ggpo.size * 100 / 2
    assert abs(against["ggpo"].rung - against["ggpo"].offline - expected) < 1e-9
    assert against["ggpo"].difference.mean == pytest.approx(expected)
    assert against["grpo"].difference.number().text() == "+0.00 [+0.00, +0.00] not resolved"
    assert ladder.claim_above["N = 4"]["grpo"].mean == pytest.approx(expected)
    assert ladder.claim_above["offline"]["grpo"].mean == 0.0
    # Offline every run falls after its peak; at N = 4 none does.
    assert ladder.falls["N = 4"]["ggpo"].fall.mean == 0.0 and ladder.falls["offline"]["ggpo"].fall.mean > 0
    rounds = ladder.rounds["N = 4"]["ggpo"]
    assert (
        rounds[ROUND_K3] == 0.5 and rounds[f"{MISMATCH_K3}@3"] == 0.03 and rounds[f"{MISMATCH_K3}@0"] == 0.0
    )
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "| GGPO | " in readme and "N = 4" in readme


def test_a_rung_without_counts_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    result = ggpo_here(
        "ladder-report", "--offline", str(tmp_path / "empty"), "--rungs", str(tmp_path / "empty")
    )
    assert (
        result.returncode != 0
        and "has no counts.json: give the folder of a finished ggpo compare" in result.stderr
    )


def test_a_rung_that_trained_fewer_methods_is_reported_beside_the_others(tmp_path):
    """N = 1 with GRPO and GGPO only (the time it had), beside N = 4 and offline with AGRO too."""
    offline = tmp_path / "offline"
    offline.mkdir()
    _counts({"grpo": 0, "agro": 0, "ggpo": 0}, falls=True).write(offline / "counts.json")
    _rung(tmp_path / "sync4", _counts({"grpo": 0, "agro": 3, "ggpo": 6}, falls=False), sync_every=4)
    sync1 = _counts({"grpo": 0, "ggpo": 6}, falls=False)
    _rung(tmp_path / "sync1", sync1, sync_every=1, others=("grpo-tis",))  # a method it no longer trains
    rungs = f"{tmp_path / 'sync1'},{tmp_path / 'sync4'}"
    out = tmp_path / "out"
    result = ggpo_here("ladder-report", "--offline", str(offline), "--rungs", rungs, "--out", str(out))
    assert result.returncode == 0, result.stderr
    ladder = Ladder.read(out)
    assert sorted(ladder.against_offline["N = 1"]) == ["ggpo", "grpo"] == sorted(ladder.rounds["N = 1"])
    assert sorted(ladder.claim_above["N = 1"]) == ["grpo"] and sorted(ladder.claim_above["N = 4"]) == [
        "agro",
        "grpo",
    ]
    # Each method has the same counts at N = 1 and 4: flat, exactly; from N = 4 to offline GGPO loses what
    # N = 4 gained over it.
    flat = "+0.00 [+0.00, +0.00] not resolved"
    assert {m: v.number().text() for m, v in ladder.steps["N = 1 → N = 4"].items()} == {
        "grpo": flat,
        "ggpo": flat,
    }
    ggpo = ladder.against_offline["N = 4"]["ggpo"]
    assert ladder.steps["N = 4 → offline"]["ggpo"].mean == pytest.approx(ggpo.offline - ggpo.rung)
    assert sorted(ladder.steps["N = 4 → offline"]) == ["agro", "ggpo", "grpo"]
    readme = (out / "README.md").read_text()
    assert "| N = 1 | GGPO | 0.5 | " in readme and " | 0 | — | — | — |" in readme  # no update is 1-3 stale
    agro = ladder.against_offline["N = 4"]["agro"]
    shown = f"{agro.rung:.2f} ({agro.difference.number().text()})"
    assert f"| AGRO | {agro.offline:.2f} | — | {shown} |" in readme
    # The README is rendered from the data: ggpo report writes it again from ladder.json and report.json.
    (out / "README.md").write_text("# edited\n")
    render_folder(RefreshConfig(folder=out))
    assert (out / "README.md").read_text() == readme


def test_a_rung_not_trained_with_sync_every_is_one_line(tmp_path):
    """The offline compare given as a rung: its diagnostics.csv names no N."""
    offline = tmp_path / "offline"
    offline.mkdir()
    counts = _counts({"grpo": 0}, falls=False)
    counts.write(offline / "counts.json")
    plain = [
        SimpleNamespace(method="grpo", seed=seed, settings=RunSettings({}), metrics=[{"update": 0}])
        for seed in SEEDS
    ]
    write_diagnostics(plain, offline / "diagnostics.csv")
    result = ggpo_here("ladder-report", "--offline", str(offline), "--rungs", str(offline))
    assert_one_error_line(result, "its diagnostics.csv has no sync_every column: give a compare trained with")
    assert not (offline / "README.md").exists()


def test_the_committed_ladder_is_written_again_from_the_committed_compares_alone(tmp_path):
    """docs/ladder/tiny from docs/demo's and the rungs' counts.json and diagnostics.csv, no run folder."""
    committed = REPO / "docs" / "ladder" / "tiny"
    rungs = "docs/ladder/tiny-sync1,docs/ladder/tiny-sync4"
    result = ggpo_here("ladder-report", "--offline", "docs/demo", "--rungs", rungs, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for name in ("README.md", "ladder.json", "report.json"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name
