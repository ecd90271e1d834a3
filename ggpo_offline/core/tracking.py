"""Experiment tracking for `ggpo train`: MLflow runs addressed by run id, a local SQLite file by default.

Many jobs may share one store: a new SQLite store is created once, under a file lock, and writes that fail
because another job holds the database are retried a bounded number of times."""

import http.client
import logging
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, Protocol, TypeVar

# MLflow 3.x starts a usage-telemetry thread on import that calls out to the internet; an offline research
# tool should not. setdefault keeps an explicit MLFLOW_DISABLE_TELEMETRY=false from the user.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from filelock import FileLock, Timeout  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException, RestException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID  # noqa: E402
from mlflow.utils.time import get_current_time_millis  # noqa: E402
from mlflow.utils.validation import (  # noqa: E402
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_TAG_VAL_LENGTH,
)

from ggpo_offline.core.errors import UserError  # noqa: E402

DEFAULT_DB_FILE = "mlruns.db"
ARTIFACT_FOLDER = "mlruns"  # beside the SQLite file
SQLITE_PREFIX = "sqlite:///"

STORE_LOCK_TIMEOUT_S = 120.0  # creating a store takes ~10 s on a slow disk; far longer means a stuck job
RETRY_PAUSES_S = (1.0, 2.0, 4.0, 8.0, 15.0)  # 6 attempts; SQLite already waits 20 s for its lock in each
TRANSIENT_CODES = ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")  # a server's 503 and 429

RunEndStatus = Literal["FINISHED", "FAILED", "KILLED"]
T = TypeVar("T")


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


class MlflowTracker:
    """One MLflow run addressed by id through its own client, so concurrent or nested runs never interfere.

    Metric points wait in memory and go out `MAX_METRICS_PER_BATCH` per `log_batch` call: one call per point
    costs milliseconds each on SQLite, which would dominate a fast training step.
    """

    def __init__(self, client: MlflowClient, run_id: str, flush_every: int = MAX_METRICS_PER_BATCH):
        self.run_id: str | None = run_id
        self._client = client
        self._flush_every = flush_every
        self._buffer: list[Metric] = []

    def log_params(self, params: dict) -> None:
        flat = _flatten(params)
        # The client splits into MLflow's 100-params-per-call limit itself.
        params = [Param(key, value) for key, value in flat.items()]
        self._write(lambda: self._client.log_batch(self.run_id, params=params), "params")

    def set_tags(self, tags: dict[str, str]) -> None:
        run_tags = [RunTag(key, str(value)[:MAX_TAG_VAL_LENGTH]) for key, value in tags.items()]
        self._write(lambda: self._client.log_batch(self.run_id, tags=run_tags), "tags")

    def log_metrics(self, metrics: dict[str, float | None], step: int) -> None:
        timestamp = get_current_time_millis()
        for key, value in metrics.items():
            if value is None or math.isnan(float(value)):
                continue
            self._buffer.append(Metric(key, float(value), timestamp, step))
        if len(self._buffer) >= self._flush_every:
            self.flush()

    def log_dict(self, obj: dict, artifact_file: str) -> None:
        self._write(
            lambda: self._client.log_dict(self.run_id, obj, artifact_file), f"artifact {artifact_file}"
        )

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._write(
            lambda: self._client.log_artifact(self.run_id, str(path), artifact_path), f"artifact {path}"
        )

    def flush(self) -> None:
        while self._buffer:
            # A retried batch may repeat points already stored; MLflow's SQL store skips identical points.
            batch = self._buffer[:MAX_METRICS_PER_BATCH]
            self._write(lambda batch=batch: self._client.log_batch(self.run_id, metrics=batch), "metrics")
            # Dropped only once stored, so a failed call leaves its points for the next flush.
            del self._buffer[:MAX_METRICS_PER_BATCH]

    def close(self, status: RunEndStatus = "FINISHED") -> None:
        self.flush()
        self._write(lambda: self._client.set_terminated(self.run_id, status), f"status {status}")

    def _write(self, call: Callable[[], object], what: str) -> None:
        _with_retries(call, f"{what} of run {self.run_id}", self._client.tracking_uri)


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
    `enabled=False` gives a `NullTracker` and touches no store.
    """
    if not enabled:
        return NullTracker()
    uri = _absolute_sqlite_uri(tracking_uri) if tracking_uri else default_tracking_uri()
    client = _client(uri)
    tags = {MLFLOW_PARENT_RUN_ID: parent_run_id} if parent_run_id else {}
    if resume_run_id is not None:
        _reopen_run(client, uri, resume_run_id, experiment=experiment, run_name=run_name)
        tracker = MlflowTracker(client, resume_run_id)
        tracker.set_tags(tags)
        return tracker
    experiment_id = _with_retries(
        lambda: _experiment_id(client, experiment, artifact_location=_artifact_location(uri)),
        f"experiment {experiment!r}",
        uri,
    )
    run = _with_retries(
        lambda: client.create_run(experiment_id, run_name=run_name, tags=tags), f"new run {run_name!r}", uri
    )
    return MlflowTracker(client, run.info.run_id)


def default_tracking_uri() -> str:
    """The store used when none is passed: MLFLOW_TRACKING_URI if set, else `mlruns.db` in the current folder.

    Relative SQLite paths come back absolute: MLflow caches stores by URI string, so a relative one would keep
    writing to the first folder's file after a chdir.
    """
    return _absolute_sqlite_uri(os.environ.get("MLFLOW_TRACKING_URI") or f"{SQLITE_PREFIX}{DEFAULT_DB_FILE}")


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
    db_path = _sqlite_path(tracking_uri)
    if db_path is not None:
        _check_writable(db_path)


def set_parent(tracking_uri: str, run_id: str, parent_run_id: str) -> None:
    """Nest an existing run under `parent_run_id` (MLflow keeps the parent as a run tag)."""
    client = _client(_absolute_sqlite_uri(tracking_uri))
    _with_retries(
        lambda: client.set_tag(run_id, MLFLOW_PARENT_RUN_ID, parent_run_id),
        f"parent of run {run_id}",
        tracking_uri,
    )


def _client(uri: str) -> MlflowClient:
    """A client whose store exists: a new SQLite store is created and migrated by one process at a time.

    MLflow migrates an empty SQLite file when it first opens it, with no lock of its own: two jobs opening a
    fresh store at once both migrate, and one dies half-way ("duplicate column name"). Building the client
    builds the store, so under `<db>.lock` one job migrates and every later one finds it current.
    """
    # A new SQLite store runs MLflow's schema migrations and says so at INFO: noise for our CLI.
    # (MLflow already keeps alembic's own loggers at WARNING.)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    db_path = _sqlite_path(uri)
    # Nothing can be created in a read-only folder, so readers of a finished store need no lock there.
    if db_path is None or not os.access(db_path.parent, os.W_OK | os.X_OK):
        return MlflowClient(tracking_uri=uri)
    lock_path = f"{db_path}.lock"
    try:
        with FileLock(lock_path, timeout=STORE_LOCK_TIMEOUT_S):
            return MlflowClient(tracking_uri=uri)
    except Timeout as err:
        raise UserError(
            f"MLflow store {db_path} is locked by another process for more than {STORE_LOCK_TIMEOUT_S:g} s: "
            f"{lock_path} is held while a job creates the store; retry when it is done, or pass --no-tracking"
        ) from err


def _with_retries(call: Callable[[], T], what: str, store: str) -> T:
    """`call()`, again after each pause of `RETRY_PAUSES_S` while it fails transiently (another writer holds
    the store); a `UserError` naming `store` and `what` once they run out. Other errors are raised at once."""
    for pause in (*RETRY_PAUSES_S, None):
        try:
            return call()
        except MlflowException as err:
            if not _is_transient(err):
                raise
            if pause is None:
                attempts, waited = len(RETRY_PAUSES_S) + 1, sum(RETRY_PAUSES_S)
                message = str(err.message)
                reason = "database is locked" if "database is locked" in message else message.splitlines()[0]
                raise UserError(
                    f"MLflow store {store}: writing {what} failed {attempts} times over {waited:g} s "
                    f"({reason[:200]}); too many jobs write to it at once: use an MLflow server "
                    "(--tracking-uri http://HOST:5000) or pass --no-tracking"
                ) from err
        time.sleep(pause)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _is_transient(err: MlflowException) -> bool:
    if err.error_code not in TRANSIENT_CODES:
        return False
    # MLflow's SQL store gives every OperationalError this code, "no such table" included: of those only
    # SQLite's lock timeout passes by waiting. A server's 503/429 is transient by definition.
    return isinstance(err, RestException) or "database is locked" in str(err.message)


def _flatten(params: dict, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}; values cut to MLflow's param length limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, prefix=f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_VAL_LENGTH]
    return flat


def _reopen_run(client: MlflowClient, uri: str, run_id: str, *, experiment: str, run_name: str) -> None:
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise UserError(f"cannot resume MLflow run {run_id} from {uri}: {err.message}") from err
    run_experiment = client.get_experiment(run.info.experiment_id).name
    if run_experiment != experiment:
        raise UserError(
            f"cannot resume MLflow run {run_id}: it belongs to experiment {run_experiment!r}, "
            f"not {experiment!r}"
        )
    _with_retries(lambda: client.update_run(run_id, status="RUNNING", name=run_name), f"run {run_id}", uri)


def _experiment_id(client: MlflowClient, name: str, *, artifact_location: str | None) -> str:
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        # Another process (a parallel sweep) may have created it since the lookup.
        existing = client.get_experiment_by_name(name)
        if existing is None:
            raise
        return existing.experiment_id


def _artifact_location(uri: str) -> str | None:
    """Artifacts of a SQLite store go to `mlruns/` beside the database; other stores choose for themselves."""
    db_path = _sqlite_path(uri)
    return None if db_path is None else (db_path.parent / ARTIFACT_FOLDER).resolve().as_uri()


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (relative to the cwd unless absolute); None for others."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    path = uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def _absolute_sqlite_uri(uri: str) -> str:
    db_path = _sqlite_path(uri)
    if db_path is None or db_path.is_absolute():
        return uri
    return f"{SQLITE_PREFIX}{Path.cwd()}/{uri.removeprefix(SQLITE_PREFIX)}"


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
