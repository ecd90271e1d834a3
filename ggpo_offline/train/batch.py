"""Read a planned minibatch from the pool and lay it out as padded tensors, groups contiguous."""

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

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
        """Micro-batches on group boundaries (so group statistics never straddle them)."""
        if responses_per_micro_batch is None or responses_per_micro_batch >= self.num_responses:
            return [self]
        step = max(self.group_size, responses_per_micro_batch // self.group_size * self.group_size)
        return [self._rows(slice(start, start + step)) for start in range(0, self.num_responses, step)]

    def _rows(self, rows: slice) -> "Minibatch":
        groups = slice(
            rows.start // self.group_size, -(-min(rows.stop, self.num_responses) // self.group_size)
        )
        return Minibatch(
            self.input_ids[rows],
            self.attention_mask[rows],
            self.prompt_lengths[rows],
            self.response_ids[rows],
            self.mask[rows],
            self.behavior_logp[rows],
            self.rewards[rows],
            self.truncated[rows],
            self.group_ids[groups],
            self.group_size,
        )


class MinibatchReader:
    """Loads the rows of planned groups, reading only the Parquet row groups that hold them."""

    def __init__(self, path: Path, index: PoolIndex, pad_id: int):
        self.parquet = pq.ParquetFile(path)
        self.index = index
        self.pad_id = pad_id

    def read(self, group_ids: list[int]) -> Minibatch:
        row_groups = sorted({rg for gid in group_ids for rg in self.index.row_groups_of[gid]})
        table = self.parquet.read_row_groups(row_groups, columns=COLUMNS)
        table = table.filter(pc.is_in(table.column("group_id"), pa.array(group_ids, pa.int64())))
        rows = {}
        for row in table.to_pylist():
            rows.setdefault(row["group_id"], []).append(row)
        ordered = [row for gid in group_ids for row in sorted(rows[gid], key=lambda r: r["sample_idx"])]
        return self._tensors(ordered, list(group_ids))

    def _tensors(self, rows: list[dict], group_ids: list[int]) -> Minibatch:
        B = len(rows)
        L = max(len(r["prompt_token_ids"]) + len(r["response_token_ids"]) for r in rows)
        T = max(len(r["response_token_ids"]) for r in rows)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((B, L), dtype=torch.long)
        response_ids = torch.full((B, T), self.pad_id, dtype=torch.long)
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
            group_size=self.index.group_size,
        )
