"""A pool made of other pools' groups, each stamped with the policy version that sampled it: a round of a
--lag mixed run, whose minibatch holds the shares of several samplers."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ggpo_offline.pool.info import PoolCounts, PoolInfo
from ggpo_offline.pool.schema import POOL_SCHEMA
from ggpo_offline.pool.source import open_pool
from ggpo_offline.pool.writer import PoolWriter


@dataclass(frozen=True)
class Share:
    """Groups of one pool, sampled by one policy version."""

    pool: Path
    group_ids: list[int]
    version: int


def assemble_pool(shares: list[Share], footer: PoolInfo, out: Path) -> Path:
    """Write ``out`` with the rows of every share's groups, groups in the order given (each group's
    responses in sample order), under ``footer`` with its counts recomputed from those rows and
    ``model.group_versions`` naming each group's version; replaced atomically, as every pool is written."""
    tables, versions = [], {}
    for share in shares:
        tables += [_rows(file, share.group_ids) for file in open_pool(share.pool).files]
        versions |= {str(group): share.version for group in share.group_ids}
    table = pa.concat_tables(tables)
    order = {group: rank for rank, group in enumerate(g for share in shares for g in share.group_ids)}
    rank = np.array([order[g] for g in table.column("group_id").to_pylist()])
    table = table.take(np.lexsort((table.column("sample_idx").to_numpy(), rank)))
    lengths = pc.list_value_length(table.column("response_token_ids"))
    counts = PoolCounts(
        groups=len(order),
        responses=table.num_rows,
        mixed_groups=len(order),
        mean_reward=pc.mean(table.column("reward")).as_py(),
        tokens=pc.sum(lengths).as_py(),
        truncated=pc.sum(pc.equal(table.column("finish_reason"), "length")).as_py(),
    )
    model = dataclasses.replace(footer.model, group_versions=versions)
    info = dataclasses.replace(footer, model=model, counts=counts, generation_seconds=None)
    with PoolWriter(out, overwrite=True) as writer:
        writer.write_table(table)
        return writer.close(info)


def _rows(file: Path, group_ids: list[int]) -> pa.Table:
    return pq.read_table(file, columns=POOL_SCHEMA.names, filters=[("group_id", "in", group_ids)])
