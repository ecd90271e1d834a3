"""Write a pool as Parquet, streaming row groups into a temporary file renamed into place when complete."""

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ggpo_offline.core.errors import UserError, writing
from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.pool.schema import METADATA_KEY, PARQUET_OPTIONS, POOL_SCHEMA


def check_output_path(path: Path, overwrite: bool) -> None:
    """Refuse to replace an existing pool unless the user asked for it."""
    if path.is_dir():
        raise UserError(f"{path} is a directory; give a .parquet file path for --out")
    if path.exists() and not overwrite:
        raise UserError(f"{path} already exists; pass --overwrite to replace it")


class PoolWriter:
    """Streams row groups to ``.<name>.<pid>.tmp`` beside the target; ``close`` renames it into place.

    An interrupted or failed run (disk full, folder not writable: a UserError naming the pool) leaves no
    temporary file and never a truncated pool under the final name, and an existing pool stays intact until
    the new one is complete.
    """

    def __init__(self, path: Path, overwrite: bool = False):
        self.path = Path(path)
        check_output_path(self.path, overwrite)
        self.tmp_path = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.tmp_path, POOL_SCHEMA, **PARQUET_OPTIONS)

    def write_rows(self, rows: list[dict]) -> None:
        """Append one row group (whole groups only, so groups stay contiguous)."""
        if rows:
            table = pa.Table.from_pylist(rows, schema=POOL_SCHEMA)
            with self._cleanup_on_failure(), writing(self.path):
                self._writer.write_table(table)

    def write_table(self, table: pa.Table) -> None:
        """Append one row group given as an Arrow table of pool rows (whole groups only)."""
        if table.num_rows:
            table = table.select(POOL_SCHEMA.names).cast(POOL_SCHEMA)
            with self._cleanup_on_failure(), writing(self.path):
                self._writer.write_table(table)

    def close(self, info: PoolInfo) -> Path:
        """Store the footer record (its JSON, keys sorted) under ``ggpo_offline``, then atomically rename the
        finished file into place."""
        with self._cleanup_on_failure(), writing(self.path):
            footer = json.dumps(info.to_metadata(), sort_keys=True)
            self._writer.add_key_value_metadata({METADATA_KEY: footer})
            self._writer.close()
            os.replace(self.tmp_path, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the partial file; whatever was at the final path before is untouched."""
        with suppress(Exception):  # the file is discarded; closing it may fail as the write did
            self._writer.close()
        self.tmp_path.unlink(missing_ok=True)

    @contextmanager
    def _cleanup_on_failure(self) -> Iterator[None]:
        # Callers need not use ``with``: a failed write or close removes the temporary file by itself.
        try:
            yield
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> "PoolWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.tmp_path.exists():
            self.abort()
