"""A minibatch as padded tensors, groups contiguous, and the reader that lays planned groups out so."""

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import torch

from ggpo_offline.pool.source import PoolSource, open_pool
from ggpo_offline.train.pool_index import PoolIndex


@dataclass
class Minibatch:
    """B = G·m responses (each group's m responses adjacent) as right-padded tensors.

    ``input_ids`` holds prompt + response; response token t of row i sits at position
    ``prompt_lengths[i] + t`` and is predicted by the logits at the position before it.
    """

    input_ids: torch.Tensor  # (B, L) prompt + response, right-padded
    attention_mask: torch.Tensor  # (B, L)
    prompt_lengths: torch.Tensor  # (B,)
    response_ids: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T) 1 on response tokens through the first EOS (SPEC token mask)
    behavior_logp: torch.Tensor  # (B, T) stored log μ
    rewards: torch.Tensor  # (B,)
    truncated: torch.Tensor  # (B,) finish_reason == "length"
    group_ids: list[int]
    group_size: int

    @property
    def num_responses(self) -> int:
        return self.input_ids.shape[0]

    def split(self, responses_per_micro_batch: int | None) -> list["Minibatch"]:
        """Micro-batches on group boundaries (so group statistics never straddle them), length-sorted:
        groups are taken in order of their longest sequence and each micro-batch is cut to its own
        longest row, so little of a forward pass is spent on padding."""
        if responses_per_micro_batch is None or responses_per_micro_batch >= self.num_responses:
            return [self]
        m = self.group_size
        per_micro = max(1, responses_per_micro_batch // m)
        longest = self.attention_mask.sum(dim=1).reshape(-1, m).max(dim=1).values  # per group
        order = sorted(range(len(self.group_ids)), key=lambda g: (int(longest[g]), g))
        return [self._groups(order[start : start + per_micro]) for start in range(0, len(order), per_micro)]

    def _groups(self, groups: list[int]) -> "Minibatch":
        """The rows of ``groups`` (indices into ``group_ids``), without padding columns none of them uses."""
        m = self.group_size
        rows = torch.tensor([g * m + i for g in groups for i in range(m)])
        width = int(self.attention_mask[rows].sum(dim=1).max())
        steps = int(self.mask[rows].sum(dim=1).max())
        return Minibatch(
            self.input_ids[rows, :width],
            self.attention_mask[rows, :width],
            self.prompt_lengths[rows],
            self.response_ids[rows, :steps],
            self.mask[rows, :steps],
            self.behavior_logp[rows, :steps],
            self.rewards[rows],
            self.truncated[rows],
            [self.group_ids[g] for g in groups],
            m,
        )


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

    def __init__(self, pool: Path | PoolSource, index: PoolIndex, pad_id: int):
        source = pool if isinstance(pool, PoolSource) else open_pool(pool)  # a file or a shard directory
        self.row_groups = source.row_groups
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
