"""Check a pool file against the schema and the pool invariants, streaming, and name the first problem."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ggpo_offline.core.errors import UserError, one_line
from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.pool.schema import POOL_SCHEMA, SCHEMA_VERSION
from ggpo_offline.pool.source import PoolSource, open_pool

FINISH_REASONS = ("stop", "length")


class PoolInvalid(UserError):
    """A pool that breaks the schema or an invariant; the message names the first problem."""


@dataclass(frozen=True)
class ValidationReport:
    """What a successful validation saw."""

    path: Path
    rows: int
    groups: int
    group_size: int
    tokens: int
    info: PoolInfo
    """The pool's metadata, which validation checked."""
    source: PoolSource
    """The pool as validation opened it, for the command to read on (`PoolSource.row_groups`)."""

    def summary(self) -> str:
        return (
            f"{self.path}: valid pool, {self.groups} groups x {self.group_size} = {self.rows} responses, "
            f"{self.tokens} response tokens"
        )


def _is_int(value: object) -> bool:
    # JSON true/false load as bool, a subclass of int; 4.0 is a float. Neither is a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_metadata(path: Path, info: PoolInfo) -> None:
    """The fields validation and `train` rely on: the schema version, the group size m, the model."""
    version = info.schema_version
    if not _is_int(version) or version != SCHEMA_VERSION:
        raise PoolInvalid(f"{path}: metadata schema_version is {version!r}, expected {SCHEMA_VERSION}")
    m = info.sampling.m
    if not _is_int(m) or m < 1:
        raise PoolInvalid(f"{path}: metadata sampling.m is {m!r}, expected a positive integer")
    for key in ("name", "path"):  # `train` finds the pool's model through these
        value = getattr(info.model, key)
        if value is not None and not isinstance(value, str):
            raise PoolInvalid(f"{path}: metadata model.{key} is {value!r}, expected a string")


def _check_schema(path: Path, schema: pa.Schema) -> None:
    for field in POOL_SCHEMA:
        copies = len(schema.get_all_field_indices(field.name))
        if copies == 0:
            raise PoolInvalid(f"{path}: column '{field.name}' is missing")
        if copies > 1:
            raise PoolInvalid(f"{path}: column '{field.name}' appears {copies} times")
        actual = schema.field(field.name).type
        if actual != field.type:
            raise PoolInvalid(f"{path}: column '{field.name}' has type {actual}, expected {field.type}")


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


class _GroupTracker:
    """Follows group boundaries across batches: contiguous groups, each of exactly ``m`` rows."""

    def __init__(self, path: Path, m: int):
        self.path, self.m = path, m
        self.current: int | None = None
        self.current_prompt: str | None = None
        self.count = 0
        self.finished: set[int] = set()

    def _fail(self, row: int, column: str, what: str) -> None:
        raise PoolInvalid(f"{self.path}: row {row}, column '{column}': {what}")

    def _close_group(self, row: int) -> None:
        if self.current is not None:
            if self.count != self.m:
                what = f"group {self.current} has {self.count} rows, expected m = {self.m}"
                self._fail(row - 1, "group_id", what)
            self.finished.add(self.current)

    def feed(self, start: int, group_ids: np.ndarray, sample_idx: np.ndarray, prompt_ids: list) -> None:
        for offset, (gid, sidx, pid) in enumerate(
            zip(group_ids.tolist(), sample_idx.tolist(), prompt_ids, strict=True)
        ):
            row = start + offset
            if gid != self.current:
                self._close_group(row)
                if gid in self.finished:
                    self._fail(row, "group_id", f"group {gid} appears again after other groups")
                self.current, self.current_prompt, self.count = gid, pid, 0
            elif pid != self.current_prompt:
                self._fail(row, "prompt_id", f"prompt_id changes inside group {gid}")
            if sidx != self.count:
                self._fail(row, "sample_idx", f"is {sidx}, expected {self.count} (position in group {gid})")
            self.count += 1

    def finish(self, rows: int) -> int:
        self._close_group(rows)
        return len(self.finished)


def _check_batch(path: Path, batch: pa.RecordBatch, start: int) -> int:
    """Row-wise invariants of one batch; returns its response token count."""

    def fail(index: int, column: str, what: str) -> None:
        raise PoolInvalid(f"{path}: row {start + index}, column '{column}': {what}")

    for field in POOL_SCHEMA:
        column = batch.column(field.name)
        try:
            # A pool written without page checksums (older, or by another tool) can hold a flipped byte that
            # yields broken list offsets or strings that are not UTF-8; only a full validation notices.
            column.validate(full=True)
        except pa.ArrowInvalid as exc:
            rows = f"rows {start}-{start + batch.num_rows - 1}"
            raise PoolInvalid(
                f"{path}: {rows}, column '{field.name}': corrupt data ({one_line(exc)})"
            ) from None
        if not field.nullable and column.null_count:
            fail(_first(column.is_null().to_numpy(zero_copy_only=False)), field.name, "is null")

    for name in ("prompt_token_ids", "response_token_ids"):
        column = batch.column(name)
        if (bad := _first(pc.list_value_length(column).to_numpy() == 0)) is not None:
            fail(bad, name, "is empty")
        ids = column.flatten()
        null_ids = ids.is_null().to_numpy(zero_copy_only=False)
        negative = ids.fill_null(0).to_numpy() < 0
        if (bad_flat := _first(null_ids | negative)) is not None:
            row = pc.list_parent_indices(column)[bad_flat].as_py()
            what = "a null token id" if null_ids[bad_flat] else f"token id {ids[bad_flat].as_py()}"
            fail(row, name, f"holds {what} (token ids must be >= 0)")

    tokens, logprobs = batch.column("response_token_ids"), batch.column("behavior_logprobs")
    n_tokens = pc.list_value_length(tokens).to_numpy()
    n_logprobs = pc.list_value_length(logprobs).to_numpy()
    if (bad := _first(n_tokens != n_logprobs)) is not None:
        fail(bad, "behavior_logprobs", f"has {n_logprobs[bad]} values for {n_tokens[bad]} response tokens")

    values = logprobs.flatten()
    null_values = values.is_null().to_numpy(zero_copy_only=False)
    flat = values.to_numpy(zero_copy_only=False)  # nulls become NaN
    bad_flat = _first(null_values | ~np.isfinite(flat) | (flat > 0))
    if bad_flat is not None:
        row = pc.list_parent_indices(logprobs)[bad_flat].as_py()
        what = "a null" if null_values[bad_flat] else flat[bad_flat]
        fail(row, "behavior_logprobs", f"holds {what} (log-probs must be finite and <= 0)")

    rewards = batch.column("reward").to_numpy(zero_copy_only=False)
    if (bad := _first(~np.isin(rewards, (0.0, 1.0)))) is not None:
        fail(bad, "reward", f"is {rewards[bad]}, expected 0 or 1")

    reasons = batch.column("finish_reason").to_pylist()
    for index, reason in enumerate(reasons):
        if reason not in FINISH_REASONS:
            fail(index, "finish_reason", f"is {reason!r}, expected one of {FINISH_REASONS}")
    return int(n_tokens.sum())


def validate_pool(path: Path | str, batch_size: int = 8192) -> ValidationReport:
    """Validate a pool file, or a directory of shard files, without loading it whole; raises PoolInvalid
    naming the first problem."""
    path = Path(path)
    if path.is_dir():
        return validate_shards(path, batch_size)
    if not path.is_file():
        raise PoolInvalid(f"{path}: no such pool file or directory")
    source = open_pool(path)
    info = source.info
    _check_metadata(path, info)
    m = info.sampling.m
    rows = tokens = 0
    try:
        (parquet,) = source.row_groups.parquets
        _check_schema(path, parquet.schema_arrow)
        tracker = _GroupTracker(path, m)
        for batch in parquet.iter_batches(batch_size=batch_size, columns=POOL_SCHEMA.names):
            tokens += _check_batch(path, batch, rows)
            tracker.feed(
                rows,
                batch.column("group_id").to_numpy(),
                batch.column("sample_idx").to_numpy(),
                batch.column("prompt_id").to_pylist(),
            )
            rows += batch.num_rows
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
        if "CRC checksum" in str(exc):
            raise PoolInvalid(
                f"{path}: corrupt data after row {rows}: a page fails its checksum (the file changed after "
                "it was written)"
            ) from None
        raise PoolInvalid(f"{path}: unreadable data after row {rows} ({one_line(exc)})") from None
    if rows == 0:
        raise PoolInvalid(f"{path}: the pool has no rows")
    groups = tracker.finish(rows)
    return ValidationReport(path, rows, groups, m, tokens, info, source)


def validate_shards(path: Path, batch_size: int = 8192) -> ValidationReport:
    """Validate a shard directory: the shards agree and are complete, each is a valid pool, and no group id
    appears in two shards (every shard's groups are distinct prompt positions of one dataset)."""
    try:
        source = open_pool(path)
    except UserError as exc:
        raise PoolInvalid(str(exc)) from None
    reports = [validate_pool(file, batch_size) for file in source.files]
    seen: dict[int, str] = {}
    for file, report in zip(source.files, reports, strict=True):
        (parquet,) = report.source.row_groups.parquets
        ids = pc.unique(parquet.read(columns=["group_id"]).column("group_id")).to_numpy()
        if seen and (clash := np.intersect1d(ids, np.fromiter(seen, dtype=np.int64))).size:
            gid = int(clash[0])
            raise PoolInvalid(f"{path}: group {gid} appears in two shards ({seen[gid]} and {file.name})")
        seen.update(dict.fromkeys(ids.tolist(), file.name))
    return ValidationReport(
        path=path,
        rows=sum(r.rows for r in reports),
        groups=sum(r.groups for r in reports),
        group_size=reports[0].group_size,
        tokens=sum(r.tokens for r in reports),
        info=source.info,
        source=source,
    )
