"""The README's make targets plan runs that fit their pools: the exact `ggpo compare` commands `make demo`,
`make beyond`, `make corrections`, `make tune-lr`, `make tune-corrections` and `make arc` run (read from the
Makefile by running it with a `ggpo` that records them), and the plan of `make chaos` (tests/chaos.py), each
checked by `--dry-run` against a pool of its shape. A change that makes a target's plan larger than its pool
fails here, not an hour into the job."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, synthetic_rows, write_synthetic_pool
from test_cli import ggpo_here

from ggpo_offline.core.model_io import load_tokenizer, tiny_model_dir, tokenizer_sha256

SHAPES = {
    # The default pool: 500 groups x 8 of which 486 have mixed rewards, and the demo's, its first 256 prompts
    # (249 mixed), as docs/beyond's and docs/demo's pool sections record them;
    # `test_the_pool_shapes_are_the_committed_reports` keeps them equal.
    "pools/base.parquet": (500, 8, 486),
    "pools/demo.parquet": (256, 8, 249),
    # The arc pool (1024 prompts x 8): 998 mixed groups, measured in the footer of the pool `make arc`'s
    # command generated (`ggpo generate-pool --num-prompts 1024`, 2026-12-05; the arc report does not
    # record it). Its 60 updates x 8 groups use 480 per seed, so even doubled (960) they fit.
    "pools/arc.parquet": (1024, 8, 998),
    # make regimes' mismatch doses: the demo's prompts sampled at tau 1.2 and 1.4 for a learner at 1 (the
    # footers of the pools its commands generated, 2026-12-07: 241 and 231 mixed groups).
    "pools/demo-t1.2.parquet": (256, 8, 241),
    "pools/demo-t1.4.parquet": (256, 8, 231),
}
SAMPLING = {
    "pools/demo-t1.2.parquet": {"temperature": 1.2, "learner_temperature": 1.0},
    "pools/demo-t1.4.parquet": {"temperature": 1.4, "learner_temperature": 1.0},
}
"""The pools whose sampling is not the default's."""
RECORDER = """#!{python}
import json, os, sys
with open(os.environ["GGPO_CALLS"], "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def shaped_pool(path: Path, groups: int, m: int, mixed: int, sampling: dict | None = None) -> Path:
    """A valid pool of the embedded model's tokenizer with ``groups`` groups of ``m``, the first ``mixed``
    of them with mixed rewards: what a plan reads from a pool (its footer, group ids and rewards);
    ``sampling``: settings that are not the default's."""
    rows = synthetic_rows(groups, m)
    for row in rows:
        row["reward"] = float(row["group_id"] < mixed and row["sample_idx"] == 0)
    meta = {
        "schema_version": 1,
        "model": {"name": "embedded:tiny"},
        "tokenizer": {"sha256": tokenizer_sha256(load_tokenizer(tiny_model_dir()))},
        "sampling": {"m": m, "temperature": 1.0, "top_p": 1.0, "top_k": 0, **(sampling or {})},
        # what make ladder's rounds sample from: the rest of the pool's dataset
        "config": {"dataset": "arith:train", "num_prompts": groups},
        "dataset": {"spec": "arith:train", "num_problems": groups},
        "counts": {"prompts": groups, "groups": groups, "mixed_groups": mixed},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_synthetic_pool(path, m=m, rows=rows, metadata=meta)


def make_calls(target: str, folder: Path) -> list[list[str]]:
    """The `ggpo` commands ``make target`` runs, in order, from ``folder`` (pools there), none executed."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    recorder = bin_dir / "ggpo"
    recorder.write_text(RECORDER.format(python=sys.executable))
    recorder.chmod(0o755)
    calls = folder / "calls.jsonl"
    calls.unlink(missing_ok=True)
    ceilings = REPO / "ggpo_offline" / "organism" / "tiny_model" / "styles.json"
    variables = [f"VENV={REPO / '.venv'}", f"BIN={bin_dir}", f"CEILINGS={ceilings}"]
    done = subprocess.run(
        ["make", "-s", "-f", str(REPO / "Makefile"), "-o", "setup", target, *variables],
        cwd=folder,
        env={**os.environ, "GGPO_CALLS": str(calls)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


def dry_run_every_plan(target: str, folder: Path) -> list[str]:
    """Each `compare` or `train` command of ``make target`` through `--dry-run`: its output (it must pass)."""
    plans = []
    for call in make_calls(target, folder):
        if call[0] in ("compare", "train"):
            result = ggpo_here(*call, "--dry-run", cwd=folder)
            assert result.returncode == 0, f"make {target}: ggpo {' '.join(call)}\n{result.stderr}"
            plans.append(result.stdout)
    return plans


@pytest.fixture(scope="module")
def shaped(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("targets")
    for name, (groups, m, mixed) in SHAPES.items():
        shaped_pool(folder / name, groups, m, mixed, SAMPLING.get(name))
    return folder


@pytest.mark.parametrize(
    "target, compares",
    [
        ("demo", 1),
        ("beyond", 1),
        ("corrections", 1),
        ("tune-lr", 6),
        ("tune-corrections", 6),
        ("arc", 3),
        ("ladder", 3),
        ("regimes", 7),
    ],  # fmt: skip
)
def test_every_compare_a_make_target_runs_fits_its_pool(shaped, target, compares):
    plans = dry_run_every_plan(target, shaped)
    assert len(plans) == compares
    assert all("dry run: nothing was written" in plan for plan in plans)
    if target == "ladder":  # 20 updates at N = 1 and 4 and the arc's 60, its two lanes' calls in any order
        rounds = sorted(
            line.split(";")[0] for plan in plans for line in plan.splitlines() if "rounds:" in line
        )
        assert rounds == ["rounds: 15 of 4 updates", "rounds: 20 of 1 update", "rounds: 5 of 4 updates"]
    if target == "regimes":  # K = 0 samples from update 1, K = 1 and mixed K = 4 from 2, K = 2 from 3
        rounds = sorted(
            line.split(";")[0] for plan in plans for line in plan.splitlines() if "rounds:" in line
        )
        assert rounds == ["rounds: 18 of 1 update", *["rounds: 19 of 1 update"] * 2, "rounds: 20 of 1 update"]
    written = sorted(str(p.relative_to(shaped)) for p in shaped.rglob("*") if p.parent.name != "bin")
    expected = [
        "bin",
        "calls.jsonl",
        "pools",
        *sorted(SHAPES),
    ]
    # Nothing but make arc's own `mkdir -p` of its ablations folder: no report, run or MLflow store.
    assert [p for p in written if p not in expected] in (
        [],
        ["reports", "reports/arc", "reports/arc/ablations"],
    )


@pytest.mark.parametrize("target, count", [("demo", 1), ("beyond", 1), ("corrections", 1), ("regimes", 7)])
def test_a_two_core_target_runs_its_compares_two_runs_at_a_time(shaped, target, count):
    """Compares whose runs two workers share, one a core (`--jobs 2`): no fixed half each."""
    compares = [call for call in make_calls(target, shaped) if call[0] == "compare"]
    assert len(compares) == count and all(c[c.index("--jobs") + 1] == "2" for c in compares)


def test_an_arc_plan_larger_than_its_pool_is_refused_before_anything_runs(shaped):
    """make arc's commands with 125 updates (1000 groups a seed, two more than the pool's 998 mixed ones):
    every compare is refused with the real run's one line. (Doubled, 120 updates, still fit: 960.)"""
    for call in make_calls("arc", shaped):
        if call[0] == "compare":
            result = ggpo_here(*call, "--updates", "125", "--dry-run", cwd=shaped)
            assert result.returncode == 1
            assert result.stderr.strip() == (
                "error: the pool has 998 mixed-reward groups but 125 updates x 8 groups need 1000; lower "
                "--updates or --groups-per-batch, or generate a larger pool"
            )


def test_arc_explain_needs_the_arc_runs_and_its_plans_fit_the_arc_pool(shaped, tmp_path):
    """make arc-explain adds ablations to make arc's report: without make arc's runs it stops with one line
    before any compare; with them, its four compares (beta 0.03, 0.1, 0.3; bounded push) fit the pool."""
    (tmp_path / "pools").mkdir()
    (tmp_path / "pools" / "arc.parquet").symlink_to(shaped / "pools" / "arc.parquet")
    refused = subprocess.run(
        ["make", "-s", "-f", str(REPO / "Makefile"), "-o", "setup", "arc-explain", f"VENV={REPO / '.venv'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0
    assert refused.stdout.strip() == "error: reports/arc holds no arc runs; run make arc first"
    for part in ("first", "second"):
        (tmp_path / "reports" / "arc" / part).mkdir(parents=True)
        (tmp_path / "reports" / "arc" / part / "compare.json").write_text("{}")
    plans = dry_run_every_plan("arc-explain", tmp_path)
    assert len(plans) == 4 and all("dry run: nothing was written" in plan for plan in plans)
    calls = make_calls("arc-explain", tmp_path)
    # the two lanes run side by side, so their calls come in either order
    assert sorted(call[call.index("--out") + 1] for call in calls if call[0] == "compare") == [
        f"reports/arc/ablations/{name}" for name in ("beta-0.03", "beta-0.1", "beta-0.3", "bounded-push")
    ]
    assert calls[-1][0] == "arc-report"


def test_the_pool_shapes_are_the_committed_reports():
    for report, pool in (("demo", "pools/demo.parquet"), ("beyond", "pools/base.parquet")):
        groups, m, mixed = SHAPES[pool]
        readme = (REPO / "docs" / report / "README.md").read_text()
        line = f"- {groups} groups × m = {m} = {groups * m} responses"
        assert line in readme and f"{mixed} mixed groups" in readme, report


def test_the_chaos_runs_plan_fits_the_pool_it_generates(tmp_path):
    """`make chaos` generates its pool (tests/chaos.py's POOL, hf engine) and dry-runs its training plan on
    it before the uninterrupted run: the same two steps here."""
    from chaos import POOL, TRAIN

    pool = tmp_path / "chaos.parquet"
    made = ggpo_here(*POOL, "--out", str(pool), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    plan = ggpo_here(*TRAIN, "--pool", str(pool), "--out", str(tmp_path / "run"), "--dry-run", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert not (tmp_path / "run").exists()
