"""Experiment tracking for `ggpo train`: the tracker a run writes to, where its store is, and whether it can
be reached. Tracked runs are MLflow runs addressed by run id, a local SQLite file by default (`mlflow_runs`,
imported only when a run is tracked); `--no-tracking` gives a `NullTracker`."""

import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.store import (
    DEFAULT_DB_FILE,
    SQLITE_PREFIX,
    RunEndStatus,
    absolute_sqlite_uri,
    sqlite_path,
)


class Tracker(Protocol):
    """Where `ggpo train` sends its config, metrics and artifacts; one tracker is one run."""

    run_id: str | None

    def log_params(self, params: dict) -> None:
        """Log params once; nested dicts become dotted keys, values are str()-ed and cut to MLflow's limit."""

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set (or overwrite) run tags."""

    def log_metrics(self, metrics: dict[str, float | None], step: int) -> None:
        """Buffer metric points at `step`; None and NaN values are skipped."""

    def log_dict(self, obj: dict, artifact_file: str) -> None:
        """Store `obj` as a JSON artifact, or YAML when `artifact_file` ends in .yaml/.yml."""

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Copy a local file into the run's artifacts, under `artifact_path` if given."""

    def flush(self) -> None:
        """Send every buffered metric point to the store."""

    def close(self, status: RunEndStatus = "FINISHED") -> None:
        """Flush, then end the run with `status`."""


class NullTracker:
    """The tracker for `--no-tracking`: accepts everything, records nothing, has no run id."""

    run_id: str | None = None

    def log_params(self, params: dict) -> None:
        pass

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float | None], step: int) -> None:
        pass

    def log_dict(self, obj: dict, artifact_file: str) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, status: RunEndStatus = "FINISHED") -> None:
        pass


@contextmanager
def ending(tracker: Tracker) -> Iterator[Tracker]:
    """End the tracker's run when the block ends: FINISHED, KILLED on Ctrl-C, FAILED on any other error."""
    status: RunEndStatus = "FAILED"
    try:
        yield tracker
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.close(status)


def start_tracking(
    *,
    experiment: str,
    run_name: str,
    tracking_uri: str | None = None,
    resume_run_id: str | None = None,
    parent_run_id: str | None = None,
    enabled: bool = True,
) -> Tracker:
    """Open a run: a new one in `experiment` (created if missing), or `resume_run_id` reopened as `run_name`.

    `tracking_uri` defaults to `default_tracking_uri()`. `parent_run_id` makes the run a nested child of it.
    A resumed run must belong to `experiment`; it returns to RUNNING and its metric series continue.
    `enabled=False` gives a `NullTracker`, touches no store and does not import MLflow.
    """
    if not enabled:
        return NullTracker()
    from ggpo_offline.core import mlflow_runs

    uri = absolute_sqlite_uri(tracking_uri) if tracking_uri else default_tracking_uri()
    return mlflow_runs.open_run(
        uri,
        experiment=experiment,
        run_name=run_name,
        resume_run_id=resume_run_id,
        parent_run_id=parent_run_id,
    )


def default_tracking_uri() -> str:
    """The store used when none is passed: MLFLOW_TRACKING_URI if set, else `mlruns.db` in the current folder.

    Relative SQLite paths come back absolute: MLflow caches stores by URI string, so a relative one would keep
    writing to the first folder's file after a chdir.
    """
    return absolute_sqlite_uri(os.environ.get("MLFLOW_TRACKING_URI") or f"{SQLITE_PREFIX}{DEFAULT_DB_FILE}")


def check_tracking_reachable(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before training, with a one-line `UserError` if no run could be recorded at `tracking_uri`.

    http(s): the server's /health must answer within `timeout_s`. sqlite: the database's folder must exist and
    be writable. Other schemes are not checked.
    """
    if tracking_uri.startswith(("http://", "https://")):
        reason = _http_failure(f"{tracking_uri.rstrip('/')}/health", timeout_s)
        if reason is not None:
            raise UserError(
                f"MLflow tracking server {tracking_uri} is unreachable ({reason}); "
                "pass --no-tracking to train without it"
            )
        return
    db_path = sqlite_path(tracking_uri)
    if db_path is not None:
        _check_writable(db_path)


def set_parent(tracking_uri: str, run_id: str, parent_run_id: str) -> None:
    """Nest an existing run under `parent_run_id` (MLflow keeps the parent as a run tag)."""
    from ggpo_offline.core import mlflow_runs

    mlflow_runs.set_parent(absolute_sqlite_uri(tracking_uri), run_id, parent_run_id)


def _http_failure(url: str, timeout_s: float) -> str | None:
    """Why `url` gave no usable answer within `timeout_s`, or None if it did (any non-5xx status counts)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as err:
        err.close()
        return f"HTTP {err.code}" if err.code >= 500 else None
    except urllib.error.URLError as err:
        return str(err.reason)
    except (OSError, http.client.HTTPException) as err:
        return str(err) or type(err).__name__


def _check_writable(db_path: Path) -> None:
    folder = db_path.parent
    if not folder.is_dir():
        raise UserError(
            f"MLflow store {db_path}: folder {folder} does not exist; create it or pass --no-tracking"
        )
    if not os.access(folder, os.W_OK | os.X_OK) or (db_path.exists() and not os.access(db_path, os.W_OK)):
        raise UserError(
            f"MLflow store {db_path} is not writable; fix its permissions, pass another "
            "--tracking-uri, or pass --no-tracking"
        )
