"""Tracking: the default SQLite store, buffered metrics, resume, nesting, the null tracker, reachability."""

import http.server
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import read_metric_series
from mlflow.tracking import MlflowClient

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.tracking import (
    NullTracker,
    check_tracking_reachable,
    default_tracking_uri,
    start_tracking,
)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> Iterator[Path]:
    """One folder for the module's default store, since creating a SQLite store runs MLflow's migrations.

    Those migrations commit (and fsync) hundreds of times: ~3 s on tmpfs, ~10 s on this disk.
    """
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path_factory.mktemp("store")
        return
    folder = Path(tempfile.mkdtemp(prefix="ggpo-tracking-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(autouse=True)
def in_store_dir(store_dir, monkeypatch) -> None:
    monkeypatch.chdir(store_dir)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_default_store_is_a_sqlite_file_in_cwd_with_artifacts_beside_it(store_dir, tmp_path):
    uri = default_tracking_uri()
    assert uri == f"sqlite:///{store_dir}/mlruns.db"
    tracker = start_tracking(experiment="default-store", run_name="first")
    tracker.log_params({"lr": 1e-6, "sampling": {"m": 8, "seed": 7}, "long": "x" * 7000})
    tracker.set_tags({"method": "ggpo"})
    tracker.log_metrics({"loss": 0.5, "reward": 0.25}, step=0)
    tracker.log_metrics({"loss": 0.4}, step=3)
    tracker.log_dict({"method": "ggpo", "updates": 2}, "config.json")
    (tmp_path / "notes.txt").write_text("hello")
    tracker.log_artifact(tmp_path / "notes.txt", artifact_path="extra")
    tracker.close()

    assert (store_dir / "mlruns.db").is_file()
    run = MlflowClient(uri).get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "first"
    assert run.data.params == {"lr": "1e-06", "sampling.m": "8", "sampling.seed": "7", "long": "x" * 6000}
    assert run.data.tags["method"] == "ggpo"
    assert read_metric_series(uri, tracker.run_id) == {"loss": [(0, 0.5), (3, 0.4)], "reward": [(0, 0.25)]}
    artifacts = store_dir / "mlruns" / tracker.run_id / "artifacts"
    assert json.loads((artifacts / "config.json").read_text()) == {"method": "ggpo", "updates": 2}
    assert (artifacts / "extra" / "notes.txt").read_text() == "hello"


def test_metrics_wait_in_memory_until_flush_and_none_or_nan_are_skipped():
    tracker = start_tracking(experiment="buffer", run_name="r")
    tracker.log_metrics({"loss": 1.0, "kl": math.nan, "ess": None}, step=0)
    tracker.log_metrics({"loss": 0.5}, step=1)
    assert read_metric_series(default_tracking_uri(), tracker.run_id) == {}
    tracker.flush()
    assert read_metric_series(default_tracking_uri(), tracker.run_id) == {"loss": [(0, 1.0), (1, 0.5)]}
    tracker.close()


def test_buffer_sends_itself_at_1000_points_in_batches_of_at_most_1000(monkeypatch):
    batch_sizes: list[int] = []
    log_batch = MlflowClient.log_batch

    def counting_log_batch(self, run_id, metrics=(), **kwargs):
        if metrics:
            batch_sizes.append(len(metrics))
        return log_batch(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", counting_log_batch)
    tracker = start_tracking(experiment="batches", run_name="r")
    tracker.log_metrics({f"m{i}": float(i) for i in range(999)}, step=0)
    assert batch_sizes == []
    tracker.log_metrics({"m999": 999.0}, step=0)
    assert batch_sizes == [1000]
    tracker.log_metrics({f"m{i}": float(i) for i in range(2500)}, step=1)
    assert batch_sizes == [1000, 1000, 1000, 500]
    tracker.close()

    client = MlflowClient(default_tracking_uri())
    assert len(client.get_run(tracker.run_id).data.metrics) == 2500
    history = client.get_metric_history(tracker.run_id, "m7")
    assert [(point.step, point.value) for point in history] == [(0, 7.0), (1, 7.0)]


def test_resume_reopens_the_run_and_continues_its_series():
    first = start_tracking(experiment="resume", run_name="part-1")
    first.log_metrics({"loss": 1.0}, step=0)
    first.log_metrics({"loss": 0.9}, step=1)
    first.close("KILLED")

    resumed = start_tracking(experiment="resume", run_name="part-2", resume_run_id=first.run_id)
    client = MlflowClient(default_tracking_uri())
    assert resumed.run_id == first.run_id
    assert client.get_run(first.run_id).info.status == "RUNNING"
    resumed.log_metrics({"loss": 0.8}, step=2)
    resumed.close()

    run = client.get_run(first.run_id)
    assert (run.info.status, run.info.run_name) == ("FINISHED", "part-2")
    series = read_metric_series(default_tracking_uri(), first.run_id)
    assert series == {"loss": [(0, 1.0), (1, 0.9), (2, 0.8)]}


def test_resume_of_an_unknown_run_or_one_from_another_experiment_is_a_user_error():
    other = start_tracking(experiment="resume-other", run_name="r")
    other.close()
    with pytest.raises(UserError, match="belongs to experiment 'resume-other'"):
        start_tracking(experiment="resume-mine", run_name="r", resume_run_id=other.run_id)
    unknown = "0123456789abcdef0123456789abcdef"
    with pytest.raises(UserError, match=f"cannot resume MLflow run {unknown}"):
        start_tracking(experiment="resume-mine", run_name="r", resume_run_id=unknown)


def test_parent_run_id_makes_a_nested_child_run():
    parent = start_tracking(experiment="sweep", run_name="sweep")
    child = start_tracking(experiment="sweep", run_name="trial-0", parent_run_id=parent.run_id)
    child.close()
    parent.close()
    client = MlflowClient(default_tracking_uri())
    assert client.get_run(child.run_id).data.tags["mlflow.parentRunId"] == parent.run_id
    assert "mlflow.parentRunId" not in client.get_run(parent.run_id).data.tags


def test_disabled_tracking_gives_a_null_tracker_that_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tracker = start_tracking(experiment="off", run_name="r", enabled=False)
    assert isinstance(tracker, NullTracker)
    assert tracker.run_id is None
    tracker.log_params({"a": {"b": 1}})
    tracker.set_tags({"t": "v"})
    tracker.log_metrics({"loss": 1.0}, step=0)
    tracker.log_dict({"a": 1}, "config.json")
    tracker.log_artifact(tmp_path / "absent.txt")
    tracker.flush()
    tracker.close("FAILED")
    assert list(tmp_path.iterdir()) == []


def test_an_untracked_run_and_the_reachability_check_never_import_mlflow(tmp_path):
    """MLflow takes seconds to import: a --no-tracking run, and every torchrun worker but rank 0, skip it."""
    code = (
        "import sys; from ggpo_offline.core import tracking; "
        "tracking.start_tracking(experiment='off', run_name='r', enabled=False).close(); "
        f"tracking.check_tracking_reachable('sqlite:///{tmp_path}/mlruns.db'); "
        "import ggpo_offline.train.trainer, ggpo_offline.train.run_tracking; "
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'mlflow'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_default_uri_follows_mlflow_tracking_uri_and_makes_sqlite_paths_absolute(store_dir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert default_tracking_uri() == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///runs/x.db")
    assert default_tracking_uri() == f"sqlite:///{store_dir}/runs/x.db"


def test_check_passes_a_writable_sqlite_folder_quickly_without_creating_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = time.process_time()  # CPU: opening MLflow's store costs seconds, waiting for a core does not
    check_tracking_reachable(default_tracking_uri())
    check_tracking_reachable("sqlite:///mlruns.db")
    assert time.process_time() - started < 0.1
    assert list(tmp_path.iterdir()) == []


def test_check_rejects_a_missing_or_unwritable_sqlite_folder(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match="does not exist"):
        check_tracking_reachable(f"sqlite:///{tmp_path}/a_file/mlruns.db")
    with pytest.raises(UserError, match="does not exist"):
        check_tracking_reachable(f"sqlite:///{tmp_path}/missing/mlruns.db")
    if os.geteuid() == 0:
        pytest.skip("root may write into any folder, so the permission check cannot fail here")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(UserError, match="not writable"):
        check_tracking_reachable(f"sqlite:///{locked}/mlruns.db")


def test_check_reports_a_closed_port_as_unreachable_within_the_timeout():
    with socket.socket() as bound_not_listening:  # holds a loopback port that refuses connections
        bound_not_listening.bind(("127.0.0.1", 0))
        port = bound_not_listening.getsockname()[1]
        started = time.perf_counter()
        with pytest.raises(UserError, match=r"unreachable .*--no-tracking"):
            check_tracking_reachable(f"http://127.0.0.1:{port}", timeout_s=1)
    assert time.perf_counter() - started < 2


def test_check_gives_up_on_a_server_that_never_answers_after_the_timeout():
    with socket.socket() as silent:  # accepts connections (backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.perf_counter()
        with pytest.raises(UserError, match="unreachable"):
            check_tracking_reachable(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize(("status", "reachable"), [(200, True), (404, True), (503, False)])
def test_check_accepts_any_http_answer_but_a_server_error(status, reachable):
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if reachable:
            check_tracking_reachable(uri, timeout_s=2)
        else:
            with pytest.raises(UserError, match="HTTP 503"):
                check_tracking_reachable(uri, timeout_s=2)
    finally:
        server.shutdown()
        server.server_close()
