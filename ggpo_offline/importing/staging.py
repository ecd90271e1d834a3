"""The imported rows in arrival order, spilled to an Arrow file beside the pool and read back memory-mapped,
so that grouping a million responses holds only a few integers per response in memory."""

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from ggpo_offline.core.errors import writing

STAGING_SCHEMA = pa.schema(
    [
        ("prompt", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("answer", pa.string()),
        ("response", pa.string()),
        ("response_token_ids", pa.list_(pa.int32())),
        ("behavior_logprobs", pa.list_(pa.float32())),
        ("finish_reason", pa.string()),
        ("reward", pa.float32()),
        ("prompt_id", pa.string()),
        ("source", pa.string()),
        ("group_key", pa.string()),
        ("group_hash", pa.int64()),
        ("group_int", pa.int64()),
        ("record_hash", pa.int64()),
        ("where", pa.string()),
        ("eos_added", pa.bool_()),
    ]
)
ROWS_PER_BATCH = 4096


def hash64(text: str) -> int:
    """A signed 64-bit digest (blake2b) of ``text``: equal texts, equal hashes, and collisions negligible."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


class Staging:
    """Appends rows in batches to an uncompressed Arrow IPC file; ``table`` maps it back without copying."""

    def __init__(self, path: Path):
        self.path = path
        with writing(path):
            self._writer = pa.ipc.new_file(pa.OSFile(str(path), "wb"), STAGING_SCHEMA)
        self._rows: list[dict] = []
        self.count = 0

    def add(self, row: dict) -> None:
        key = row["group"] if row["group"] is not None else "prompt:" + repr(row["prompt_token_ids"])
        row = row | {
            "group_key": key,
            "group_hash": hash64(key),
            "group_int": int(row["group"]) if row["group_is_int"] else None,
            "record_hash": None if row["record_id"] is None else hash64(row["record_id"]),
        }
        self._rows.append(row)
        self.count += 1
        if len(self._rows) == ROWS_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            with writing(self.path):
                self._writer.write_table(pa.Table.from_pylist(self._rows, schema=STAGING_SCHEMA))
            self._rows = []

    def close(self) -> pa.Table:
        """Finish the file; the whole table, memory-mapped (pages are read as rows are taken)."""
        self._flush()
        with writing(self.path):
            self._writer.close()
        return pa.ipc.open_file(pa.memory_map(str(self.path))).read_all()


def column(table: pa.Table, name: str) -> np.ndarray:
    """One fixed-width column as numpy (nulls as the smallest int64, which no hash equals in practice)."""
    return table.column(name).fill_null(np.iinfo(np.int64).min).to_numpy()
