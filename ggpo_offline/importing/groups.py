"""Which staged rows form each group, in what order, and what is dropped: the grouping rule of an import."""

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ggpo_offline.core.errors import UserError
from ggpo_offline.importing.staging import column

NO_ID = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Grouping:
    """The pool's rows as staged row numbers, groups in order of their first response."""

    order: np.ndarray
    """Staged row of each pool row, ``[groups * m]``: group by group, a group's rows in arrival order."""
    group_ids: np.ndarray
    """Each kept group's id, ``[groups]``."""
    m: int
    sizes: dict[int, int]
    """How many groups had each size before any trimming."""
    dropped_groups: int
    """Groups smaller than --m, left out."""
    dropped_responses: int
    """Responses past the first m of a group, and those of dropped groups."""


def group_rows(staged: pa.Table, m: int | None) -> Grouping:
    """Group the staged rows by key (the source's group, else equal prompt tokens). Every group must have
    the same size unless ``m`` is given: then each keeps its first ``m`` responses and smaller groups are
    dropped. A record id seen twice is a duplicated row, refused."""
    _refuse_duplicates(staged)
    hashes = column(staged, "group_hash")
    _, first, inverse, counts = np.unique(hashes, return_index=True, return_inverse=True, return_counts=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))  # groups in order of first response
    row_rank = rank[inverse]
    order = np.lexsort((np.arange(len(hashes)), row_rank))  # by group, then arrival
    sizes = dict(sorted(zip(*np.unique(counts, return_counts=True), strict=True)))
    sizes = {int(size): int(groups) for size, groups in sizes.items()}
    if m is None:
        if len(sizes) > 1:
            raise UserError(
                f"groups of unequal size ({_sizes_text(sizes)} responses): pass --m N to keep the first N "
                "responses of each group and drop smaller groups"
            )
        m = next(iter(sizes))
    count_in_order = counts[np.argsort(rank)]  # sizes of the groups in pool order
    position = np.arange(len(order)) - np.repeat(np.cumsum(count_in_order) - count_in_order, count_in_order)
    keep_group = count_in_order >= m
    keep = (position < m) & np.repeat(keep_group, count_in_order)
    if not keep.any():
        raise UserError(f"no group has {m} responses (group sizes: {_sizes_text(sizes)})")
    order = order[keep]
    return Grouping(
        order=order,
        group_ids=_group_ids(staged, order[::m]),
        m=m,
        sizes=sizes,
        dropped_groups=int((~keep_group).sum()),
        dropped_responses=int(len(keep) - keep.sum()),
    )


def _group_ids(staged: pa.Table, first_rows: np.ndarray) -> np.ndarray:
    """The source's integer group ids when it gave them for every group, else positions 0, 1, ..."""
    given = column(staged, "group_int")[first_rows]
    if (given != NO_ID).all():
        return given
    return np.arange(len(first_rows), dtype=np.int64)


def _refuse_duplicates(staged: pa.Table) -> None:
    ids = column(staged, "record_hash")
    with_id = np.flatnonzero(ids != NO_ID)
    _, first, counts = np.unique(ids[with_id], return_index=True, return_counts=True)
    if (counts > 1).any():
        repeated = ids[with_id][first[np.argmax(counts > 1)]]
        rows = with_id[ids[with_id] == repeated][:2]
        where = staged.column("where").take(pa.array(rows)).to_pylist()
        raise UserError(f"{where[1]}: a duplicated row (the same record as {where[0]})")


def _sizes_text(sizes: dict[int, int]) -> str:
    return ", ".join(f"{groups} of {size}" for size, groups in sizes.items())
