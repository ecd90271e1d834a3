"""Durable progress of a generate-pool run: fsync'ed part files and a progress JSON, so a rerun resumes."""

import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ggpo_offline.core.errors import UserError, one_line, replacing
from ggpo_offline.core.one_writer import clear_but_the_lock
from ggpo_offline.pool.schema import PARQUET_OPTIONS, POOL_SCHEMA, open_parquet

PROGRESS_FILE = "progress.json"
PROGRESS_VERSION = 1
"""progress.json's layout (its "version"): {"version": 1, "settings": {...}, "parts": [{"file", "rows",
`PartCounts`' fields}, ...]}."""


@dataclass(frozen=True)
class PartCounts:
    """What one stored batch adds to its pool's totals (and, summed, a resumed run's)."""

    prompts_done: int = 0
    groups_kept: int = 0
    mixed_groups: int = 0
    responses: int = 0
    reward_sum: float = 0.0
    tokens: int = 0
    truncated: int = 0
    timeouts: int = 0
    errors: int = 0
    seconds: float = 0.0

    def __add__(self, other: "PartCounts") -> "PartCounts":
        return PartCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def __sub__(self, other: "PartCounts") -> "PartCounts":
        return PartCounts(*(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)))


@dataclass(frozen=True)
class StoredPart:
    """One batch's rows, stored as ``file`` in the partial folder, and what it counted."""

    file: str
    rows: int
    counts: PartCounts

    def to_dict(self) -> dict:
        return {"file": self.file, "rows": self.rows, **dataclasses.asdict(self.counts)}

    @classmethod
    def from_dict(cls, data: dict) -> "StoredPart":
        counts = {f.name: data[f.name] for f in dataclasses.fields(PartCounts)}
        return cls(data["file"], data["rows"], PartCounts(**counts))


@dataclass(frozen=True)
class StoredProgress:
    """progress.json: the settings of the command whose batches are stored, and its parts in order."""

    settings: dict
    parts: tuple[StoredPart, ...]

    @classmethod
    def read(cls, out: Path) -> "StoredProgress":
        """The record beside ``out``; OSError when there is none, ValueError (KeyError, TypeError) when it
        cannot be read as one of `PROGRESS_VERSION`."""
        record = json.loads((partial_dir(Path(out)) / PROGRESS_FILE).read_text())
        if record.get("version") != PROGRESS_VERSION:
            raise ValueError(f"version {record.get('version')!r}, expected {PROGRESS_VERSION}")
        return cls(record["settings"], tuple(StoredPart.from_dict(part) for part in record["parts"]))

    def to_dict(self) -> dict:
        parts = [part.to_dict() for part in self.parts]
        return {"version": PROGRESS_VERSION, "settings": self.settings, "parts": parts}

    @property
    def totals(self) -> PartCounts:
        return sum((part.counts for part in self.parts), PartCounts())


def partial_dir(out: Path) -> Path:
    """``pools/.base.parquet.partial/`` beside ``pools/base.parquet`` (hidden: never read as a pool shard)."""
    return out.with_name(f".{out.name}.partial")


def _fsync_dir(directory: Path) -> None:
    # A rename is durable only once the directory entry itself is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, write) -> None:
    """``write(tmp_path)``, fsync the file, rename it to ``path`` and fsync the folder; a full disk is one
    UserError naming ``path`` and leaves no temporary file (`replacing`)."""
    with replacing(path) as tmp:
        write(tmp)
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
    _fsync_dir(path.parent)


def _differences(old: dict, new: dict) -> list[str]:
    """The setting names whose values differ, as ``name (old -> new)``; long values (hashes) by name only."""
    differing = []
    for key in sorted(old.keys() | new.keys()):
        if old.get(key) != new.get(key):
            values = f"{old.get(key)!r} -> {new.get(key)!r}"
            differing.append(key if len(values) > 40 else f"{key} ({values})")
    return differing


def prompts_stored(out: Path) -> int | None:
    """How many prompts the interrupted or running generate-pool writing ``out`` has stored (None: no record
    yet, or one being replaced)."""
    try:
        return StoredProgress.read(out).totals.prompts_done
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stored_settings(out: Path) -> dict | None:
    """The settings of the interrupted generate-pool writing ``out`` (None: no record)."""
    try:
        return StoredProgress.read(out).settings
    except (OSError, ValueError, KeyError, TypeError):
        return None


class PartialRun:
    """The completed batches of one generate-pool command, kept until its pool is written.

    ``progress.json`` is the record (`StoredProgress`): it names the parts in order with their counts and the
    command's settings. A part is fsync'ed and renamed into place before the record names it, so after a
    crash every named part is whole; a part written but not yet named is simply written again.
    """

    def __init__(self, out: Path, settings: dict, overwrite: bool = False):
        self.dir = partial_dir(Path(out))
        self.settings = json.loads(json.dumps(settings))  # as it reads back (tuples become lists)
        self.parts: tuple[StoredPart, ...] = ()
        progress = self.dir / PROGRESS_FILE
        if progress.is_file():
            try:
                stored = StoredProgress.read(out)
            except (ValueError, KeyError, TypeError) as problem:  # a JSON error is a ValueError
                raise UserError(
                    f"{progress} is unreadable ({one_line(problem)}); delete {self.dir} to start over"
                ) from None
            differing = _differences(stored.settings, settings)
            if not differing:
                self.parts = stored.parts
            elif overwrite:
                clear_but_the_lock(self.dir)
            else:
                raise UserError(
                    f"{self.dir} holds an interrupted run with other settings "
                    f"(they differ in {'; '.join(differing)}); rerun that command to resume it, "
                    f"or pass --overwrite or delete {self.dir} to start over"
                )
        elif self.dir.exists() and overwrite:
            clear_but_the_lock(self.dir)  # parts without a record: nothing resumable

    @property
    def totals(self) -> PartCounts:
        """The completed parts' counts summed."""
        return StoredProgress(self.settings, self.parts).totals

    def add_part(self, rows: pa.Table, counts: PartCounts) -> None:
        """Store one completed batch durably, then record it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"part-{len(self.parts):06d}.parquet"
        _write_durably(self.dir / name, lambda tmp: pq.write_table(rows, tmp, **PARQUET_OPTIONS))
        self.parts += (StoredPart(name, rows.num_rows, counts),)
        record = StoredProgress(self.settings, self.parts).to_dict()
        _write_durably(
            self.dir / PROGRESS_FILE,
            lambda tmp: tmp.write_text(json.dumps(record, indent=1, sort_keys=True)),
        )

    def tables(self) -> Iterator[pa.Table]:
        """The completed parts' rows, in order."""
        for part in self.parts:
            yield open_parquet(self.dir / part.file).read().cast(POOL_SCHEMA)

    def remove(self) -> None:
        """Drop the parts once the pool holding them is in place (the folder goes with its writer's lock)."""
        if self.dir.exists():
            clear_but_the_lock(self.dir)
