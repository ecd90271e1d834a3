"""MLflow runs for `ggpo train` and `ggpo compare`: a tracker addressed by run id, a new SQLite store created
under a file lock, and writes retried while another job holds the store.

Imported only when a run is tracked (`tracking.start_tracking`): MLflow takes seconds to import, which a
`--no-tracking` run and every torchrun worker but rank 0 would otherwise pay at start."""

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

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
from ggpo_offline.core.store import RunEndStatus, artifact_location, sqlite_path  # noqa: E402

STORE_LOCK_TIMEOUT_S = 120.0  # creating a store takes ~10 s on a slow disk; far longer means a stuck job
RETRY_PAUSES_S = (1.0, 2.0, 4.0, 8.0, 15.0)  # 6 attempts; SQLite already waits 20 s for its lock in each
TRANSIENT_CODES = ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")  # a server's 503 and 429

T = TypeVar("T")


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


def open_run(
    uri: str, *, experiment: str, run_name: str, resume_run_id: str | None, parent_run_id: str | None
) -> MlflowTracker:
    """A new run in `experiment` (created if missing) of the store at `uri`, or `resume_run_id` reopened as
    `run_name` (see `tracking.start_tracking`)."""
    client = _client(uri)
    tags = {MLFLOW_PARENT_RUN_ID: parent_run_id} if parent_run_id else {}
    if resume_run_id is not None:
        _reopen_run(client, uri, resume_run_id, experiment=experiment, run_name=run_name)
        tracker = MlflowTracker(client, resume_run_id)
        tracker.set_tags(tags)
        return tracker
    experiment_id = _with_retries(
        lambda: _experiment_id(client, experiment, artifact_location=artifact_location(uri)),
        f"experiment {experiment!r}",
        uri,
    )
    run = _with_retries(
        lambda: client.create_run(experiment_id, run_name=run_name, tags=tags), f"new run {run_name!r}", uri
    )
    return MlflowTracker(client, run.info.run_id)


def set_parent(tracking_uri: str, run_id: str, parent_run_id: str) -> None:
    """Nest an existing run under `parent_run_id` (MLflow keeps the parent as a run tag)."""
    client = _client(tracking_uri)
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
    db_path = sqlite_path(uri)
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
