"""Where a tracking store lives: the SQLite file a ``sqlite:///`` URI names, made absolute, with its artifacts
beside it; and the statuses a run ends with."""

from pathlib import Path
from typing import Literal

DEFAULT_DB_FILE = "mlruns.db"
ARTIFACT_FOLDER = "mlruns"  # beside the SQLite file
SQLITE_PREFIX = "sqlite:///"

RunEndStatus = Literal["FINISHED", "FAILED", "KILLED"]


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (relative to the cwd unless absolute); None for others."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    path = uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def absolute_sqlite_uri(uri: str) -> str:
    db_path = sqlite_path(uri)
    if db_path is None or db_path.is_absolute():
        return uri
    return f"{SQLITE_PREFIX}{Path.cwd()}/{uri.removeprefix(SQLITE_PREFIX)}"


def artifact_location(uri: str) -> str | None:
    """Artifacts of a SQLite store go to `mlruns/` beside the database; other stores choose for themselves."""
    db_path = sqlite_path(uri)
    return None if db_path is None else (db_path.parent / ARTIFACT_FOLDER).resolve().as_uri()
