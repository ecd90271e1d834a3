"""`--dry-run` on `ggpo train` and `ggpo compare`: the plan after every check the real run makes, nothing
written, and a plan that cannot run refused with the real run's own error line."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import write_synthetic_pool
from test_cli import assert_one_error_line, ggpo_here

from ggpo_offline.train.pool_index import index_pool
from ggpo_offline.train.profile import PHASES

# A synthetic pool's tokenizer is not the embedded model's; the real run would refuse it without this.
TRAIN = ("--preset", "tiny", "--allow-tokenizer-mismatch", "--threads", "1", "--no-tracking")
SMALL = ("--updates", "2", "--groups-per-batch", "2", "--eval-every", "1", "--eval-n", "2")


def _pool(tmp_path: Path) -> tuple[Path, int]:
    pool = write_synthetic_pool(tmp_path / "pool.parquet", groups=12)
    return pool, len(index_pool(pool).mixed_group_ids)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_train_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    pool, mixed = _pool(tmp_path)
    before = _files(tmp_path)
    args = ("train", "--pool", str(pool), "--method", "ggpo", *TRAIN, *SMALL, "--out", "run")
    result = ggpo_here(*args, "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "run: train run\n" in result.stdout
    assert f"pool: {pool}: 12 groups x 4, {mixed} with mixed rewards\n" in result.stdout
    assert f"data: 2 updates x 2 groups = 4 mixed groups per seed, of {mixed} ({mixed - 4} to spare)\n" in (
        result.stdout
    )
    assert "validation: updates 0, 1, 2 x 128 problems x 2 samples\n" in result.stdout
    assert "test: 128 problems x 2 samples at the initial, final and selected checkpoints\n" in result.stdout
    assert "time: unknown (no finished run of this shape recorded its times)\n" in result.stdout
    assert _files(tmp_path) == before  # no run folder, no MLflow store, no lock


def test_a_plan_that_cannot_run_is_refused_by_the_dry_run_with_the_real_runs_line(tmp_path):
    pool, mixed = _pool(tmp_path)
    before = _files(tmp_path)
    args = ("train", "--pool", str(pool), "--method", "ggpo", *TRAIN, "--updates", "9", "--out", "run")
    need = f"the pool has {mixed} mixed-reward groups but 9 updates x 8 groups need 72"
    dry, real = ggpo_here(*args, "--dry-run", cwd=tmp_path), ggpo_here(*args, cwd=tmp_path)
    assert_one_error_line(dry, need)
    assert dry.stderr == real.stderr
    compare = ("compare", "--pool", str(pool), "--methods", "grpo,ggpo", "--seeds", "1,2", *TRAIN[:3])
    dry = ggpo_here(*compare, "--updates", "9", "--out", "report", "--dry-run", cwd=tmp_path)
    assert_one_error_line(dry, need)
    assert _files(tmp_path) == before
    # The run folder: the same refusals as the real run, and the user's files stay.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    args = ("train", "--pool", str(pool), "--method", "ggpo", *TRAIN, *SMALL, "--out", "run", "--dry-run")
    assert_one_error_line(ggpo_here(*args, cwd=tmp_path), "run already exists; pass --resume to continue it")
    assert_one_error_line(ggpo_here(*args, "--resume", cwd=tmp_path), "run has no checkpoint to resume from")
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    replace = ggpo_here(*args, "--overwrite", cwd=tmp_path)
    assert replace.returncode == 0 and "run: replace the run in run\n" in replace.stdout
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    args = ("train", "--pool", str(pool), "--method", "ggpo", *TRAIN, *SMALL, "--out", "none", "--dry-run")
    assert_one_error_line(ggpo_here(*args, "--resume", cwd=tmp_path), "--resume: none holds no run to resume")


def _earlier_run(folder: Path, config: dict, seconds: dict[str, float]) -> None:
    """A finished run as `ggpo train` leaves it, as far as an estimate reads it."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "result.json").write_text("{}")
    lines = [json.dumps({"phase": phase, "update": None, "seconds": s}) for phase, s in seconds.items()]
    (folder / "profile.jsonl").write_text("\n".join(lines) + "\n")


def test_compare_dry_run_lists_each_runs_fate_and_times_them_from_earlier_runs_of_their_shape(tmp_path):
    pool, mixed = _pool(tmp_path)
    compare = ("compare", "--pool", str(pool), "--methods", "grpo,ggpo", "--seeds", "1,2", *TRAIN, *SMALL)
    first = ggpo_here(*compare, "--out", "report", "--dry-run", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "plan: 2 method(s) x 2 seed(s) = 4 runs into report\n" in first.stdout
    assert "training 4: grpo-s1, ggpo-s1, grpo-s2, ggpo-s2\n" in first.stdout
    assert "time: unknown (no finished run of this shape recorded its times)\n" in first.stdout
    assert not (tmp_path / "report").exists()
    # Earlier runs under reports/: those of the same shape time the plan (their median, without the
    # process start and π0, which one more run does not pay); another shape is not read.
    from ggpo_offline.train.training_presets import resolve_config

    shape = resolve_config(
        "tiny",
        None,
        pool=pool,
        method="grpo",
        updates=2,
        groups_per_batch=2,
        eval_every=1,
        eval_n=2,
        threads=1,
    ).to_dict()
    assert set(PHASES) >= {"process", "pi0", "forward_backward", "evaluate"}
    for name, train_s in (("a", 30.0), ("b", 50.0), ("c", 40.0)):
        seconds = {"process": 100.0, "pi0": 100.0, "forward_backward": train_s, "evaluate": 10.0}
        _earlier_run(tmp_path / "reports" / "old" / "runs" / name, shape, seconds)
    _earlier_run(tmp_path / "reports" / "old" / "runs" / "long", {**shape, "updates": 20}, {"evaluate": 1e4})
    timed = ggpo_here(*compare, "--out", "report", "--dry-run", cwd=tmp_path)
    assert (
        "time: ~3 min on one core: 4 run(s) x 50 s, the median of 3 earlier run(s) of the same shape\n"
        in (timed.stdout)
    )


def test_planning_a_compare_imports_no_torch_until_the_pool_is_read():
    """A refused setting answers in a second: compare's planning modules leave torch to the functions that
    train (`compare/comparison.py`)."""
    modules = "ggpo_offline.compare.comparison, ggpo_offline.train.dry_run"
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
