"""Jobs sharing one MLflow store: a new SQLite store is created once, under a lock; lock errors retry."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos.databricks_pb2 import BAD_REQUEST, TEMPORARILY_UNAVAILABLE
from mlflow.tracking import MlflowClient

from ggpo_offline.core import mlflow_runs
from ggpo_offline.core.errors import UserError

GGPO = str(Path(sys.executable).parent / "ggpo")
UPDATES = 2
# What MLflow's SQL store raises when SQLite's busy timeout runs out under another writer (db/utils.py wraps
# sqlalchemy's OperationalError).
LOCKED = "(sqlite3.OperationalError) database is locked\n[SQL: INSERT INTO metrics ...]"


@pytest.fixture
def fresh_dir(tmp_path) -> Iterator[Path]:
    """An empty folder, on tmpfs when there is one: MLflow's migrations of a new store commit (and fsync)
    hundreds of times, ~3 s there and ~10 s on this disk, and every other job waits for them."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="ggpo-concurrency-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder)


def test_four_train_jobs_started_at_once_share_one_fresh_default_store(hf_pool, fresh_dir, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    common = ["train", "--pool", str(hf_pool), "--method", "grpo", "--updates", str(UPDATES)]
    common += ["--groups-per-batch", "2", "--threads", "1", "--no-test"]
    jobs = [
        subprocess.Popen(
            [GGPO, *common, "--seed", str(seed), "--out", f"run{seed}"],
            cwd=fresh_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(4)
    ]
    outputs = [job.communicate(timeout=300) for job in jobs]
    for job, (_, stderr) in zip(jobs, outputs, strict=True):
        assert job.returncode == 0, stderr[-3000:]

    client = MlflowClient(f"sqlite:///{fresh_dir / 'mlruns.db'}")
    [experiment] = client.search_experiments(filter_string=f"name = '{hf_pool.stem}'")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == [f"grpo-s{seed}" for seed in range(4)]
    ids = {stdout.split("MLflow run: ")[1].split()[0] for stdout, _ in outputs}
    assert {run.info.run_id for run in runs} == ids
    for run in runs:
        assert run.info.status == "FINISHED"
        folder = fresh_dir / run.info.run_name.replace("grpo-s", "run")
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        losses = [(r["update"], r["loss"]) for r in records if "loss" in r]
        assert len(losses) == UPDATES
        history = client.get_metric_history(run.info.run_id, "loss")
        assert sorted((point.step, point.value) for point in history) == losses


def test_processes_opening_one_fresh_store_at_once_all_find_it_migrated(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = (
        "from ggpo_offline.core.mlflow_runs import _client; "
        f"_client({uri!r}).search_experiments(max_results=1)"
    )
    jobs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    for job in jobs:
        _, stderr = job.communicate(timeout=120)
        assert job.returncode == 0, stderr[-3000:]
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]


def test_store_lock_held_too_long_is_one_user_error(tmp_path, monkeypatch):
    from filelock import FileLock

    db = tmp_path / "held.db"
    monkeypatch.setattr(mlflow_runs, "STORE_LOCK_TIMEOUT_S", 0.2)
    with FileLock(f"{db}.lock"):
        # A separate FileLock object (as another process would hold) keeps the lock in this process too.
        with pytest.raises(UserError) as caught:
            mlflow_runs._client(f"sqlite:///{db}")
    assert str(caught.value) == (
        f"MLflow store {db} is locked by another process for more than 0.2 s: {db}.lock is held while "
        "a job creates the store; retry when it is done, or pass --no-tracking"
    )


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(mlflow_runs.time, "sleep", slept.append)
    return slept


def failing(errors: list[Exception], result: str = "done"):
    """A call that raises `errors` in turn, then returns `result`; `calls` counts the attempts."""

    def call() -> str:
        call.calls += 1
        if errors:
            raise errors.pop(0)
        return result

    call.calls = 0
    return call


def test_sqlite_lock_errors_are_retried_with_growing_pauses(sleeps):
    call = failing([MlflowException(LOCKED, TEMPORARILY_UNAVAILABLE) for _ in range(2)])
    assert mlflow_runs._with_retries(call, "metrics", "sqlite:///x.db") == "done"
    assert call.calls == 3
    assert sleeps == list(mlflow_runs.RETRY_PAUSES_S[:2])
    assert sleeps[1] > sleeps[0]


def test_a_servers_503_and_429_are_retried_but_not_its_other_errors(sleeps):
    busy = RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "try later"})
    throttled = RestException({"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "slow down"})
    call = failing([busy, throttled])
    assert mlflow_runs._with_retries(call, "tags", "http://host:5000") == "done"
    assert call.calls == 3
    call = failing([RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad key"})])
    with pytest.raises(RestException, match="bad key"):
        mlflow_runs._with_retries(call, "tags", "http://host:5000")
    assert call.calls == 1 and len(sleeps) == 2


def test_a_non_transient_error_is_raised_at_once(sleeps):
    call = failing([MlflowException("Run 'abc' not found", BAD_REQUEST)])
    with pytest.raises(MlflowException, match="Run 'abc' not found"):
        mlflow_runs._with_retries(call, "metrics", "sqlite:///x.db")
    assert call.calls == 1 and sleeps == []
    # Another SQLite failure is wrapped the same way as a lock, with the same code, but waiting cannot fix it.
    call = failing(
        [MlflowException("(sqlite3.OperationalError) no such table: runs", TEMPORARILY_UNAVAILABLE)]
    )
    with pytest.raises(MlflowException, match="no such table"):
        mlflow_runs._with_retries(call, "metrics", "sqlite:///x.db")
    assert call.calls == 1 and sleeps == []


def test_a_lock_that_never_clears_ends_in_one_user_error_after_the_bounded_attempts(sleeps):
    attempts = len(mlflow_runs.RETRY_PAUSES_S) + 1
    call = failing([MlflowException(LOCKED, TEMPORARILY_UNAVAILABLE) for _ in range(attempts + 5)])
    with pytest.raises(UserError) as caught:
        mlflow_runs._with_retries(call, "metrics of run abc", "sqlite:///x.db")
    assert call.calls == attempts == 6
    assert sleeps == list(mlflow_runs.RETRY_PAUSES_S) and sum(sleeps) <= 30
    assert str(caught.value) == (
        f"MLflow store sqlite:///x.db: writing metrics of run abc failed {attempts} times over "
        f"{sum(sleeps):g} s (database is locked); too many jobs write to it at once: "
        "use an MLflow server (--tracking-uri http://HOST:5000) or pass --no-tracking"
    )
    assert "\n" not in str(caught.value)
