"""Read a planned minibatch from the pool and lay it out as padded tensors, groups contiguous."""

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import torch

from ggpo_offline.pool.source import RowGroups, open_pool
from ggpo_offline.train.minibatch import Minibatch
from ggpo_offline.train.plan import PoolIndex

COLUMNS = [
    "group_id",
    "sample_idx",
    "prompt_token_ids",
    "response_token_ids",
    "behavior_logprobs",
    "reward",
    "finish_reason",
]


class MinibatchReader:
    """Loads the rows of planned groups, reading only the Parquet row groups that hold them."""

    def __init__(self, path: Path, index: PoolIndex, pad_id: int):
        self.row_groups = RowGroups(open_pool(path).files)  # a file or a shard directory
        self.index = index
        self.pad_id = pad_id

    def read(self, group_ids: list[int]) -> Minibatch:
        row_groups = sorted({rg for gid in group_ids for rg in self.index.row_groups_of[gid]})
        table = self.row_groups.read_many(row_groups, columns=COLUMNS)
        table = table.filter(pc.is_in(table.column("group_id"), pa.array(group_ids, pa.int64())))
        rows = {}
        for row in table.to_pylist():
            rows.setdefault(row["group_id"], []).append(row)
        ordered = [row for gid in group_ids for row in sorted(rows[gid], key=lambda r: r["sample_idx"])]
        return minibatch_from_rows(ordered, list(group_ids), self.index.group_size, self.pad_id)


def minibatch_from_rows(rows: list[dict], group_ids: list[int], group_size: int, pad_id: int) -> Minibatch:
    """Pool rows (each group's rows adjacent, in sample order) as the padded tensors of a minibatch."""
    B = len(rows)
    L = max(len(r["prompt_token_ids"]) + len(r["response_token_ids"]) for r in rows)
    T = max(len(r["response_token_ids"]) for r in rows)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    response_ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T))
    behavior = torch.zeros((B, T))
    for i, row in enumerate(rows):
        prompt, response = row["prompt_token_ids"], row["response_token_ids"]
        n = len(prompt) + len(response)
        input_ids[i, :n] = torch.tensor(prompt + response)
        attention_mask[i, :n] = 1
        response_ids[i, : len(response)] = torch.tensor(response)
        mask[i, : len(response)] = 1.0  # stored responses end at the first EOS inclusive
        behavior[i, : len(response)] = torch.tensor(row["behavior_logprobs"])
    return Minibatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        prompt_lengths=torch.tensor([len(r["prompt_token_ids"]) for r in rows]),
        response_ids=response_ids,
        mask=mask,
        behavior_logp=behavior,
        rewards=torch.tensor([r["reward"] for r in rows]),
        truncated=torch.tensor([r["finish_reason"] == "length" for r in rows]),
        group_ids=group_ids,
        group_size=group_size,
    )
