"""`ggpo pool merge`: a shard directory into one pool file, streaming, groups in ascending group id order."""

import heapq
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.schema import POOL_SCHEMA, open_parquet
from ggpo_offline.pool.source import open_pool
from ggpo_offline.pool.validate import validate_pool
from ggpo_offline.pool.writer import PoolWriter, check_output_path

GROUPS_PER_ROW_GROUP = 256


def _groups(file: Path) -> Iterator[tuple[int, pa.Table]]:
    """(group_id, rows) of each group of a pool file, in file order, one row group in memory at a time."""
    parquet = open_parquet(file)
    pending: pa.Table | None = None  # the rows of a group that may continue in the next row group
    for row_group in range(parquet.num_row_groups):
        table = parquet.read_row_group(row_group, columns=POOL_SCHEMA.names)
        if pending is not None:
            table = pa.concat_tables([pending, table])
        ids = table.column("group_id").to_numpy()
        starts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist()]
        for start, end in zip(starts[:-1], starts[1:], strict=True):
            yield int(ids[start]), table.slice(start, end - start)
        pending = table.slice(starts[-1]) if len(ids) else None
    if pending is not None and pending.num_rows:
        yield int(pending.column("group_id")[0].as_py()), pending


def merge_pool(directory: Path | str, out: Path | str, overwrite: bool = False) -> Path:
    """Validate the shard directory, then write its groups, in ascending group id order, to ``out`` with the
    shards' merged metadata (no shard fields). An existing ``out`` is replaced only with ``overwrite``."""
    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory of pool shards")
    check_output_path(out, overwrite)
    if out.resolve().parent == directory.resolve():
        raise UserError(f"--out {out} is inside the shard directory; write the merged pool elsewhere")
    validate_pool(directory)
    source = open_pool(directory)
    # Each shard lists its groups in ascending prompt position, so a k-way merge by group id gives the
    # order of the unsharded run.
    merged = heapq.merge(*(_groups(f) for f in source.files), key=lambda group: group[0])
    with PoolWriter(out, overwrite) as writer:
        batch: list[pa.Table] = []
        for _, rows in merged:
            batch.append(rows)
            if len(batch) == GROUPS_PER_ROW_GROUP:
                writer.write_table(pa.concat_tables(batch))
                batch = []
        if batch:
            writer.write_table(pa.concat_tables(batch))
        return writer.close(source.info)
