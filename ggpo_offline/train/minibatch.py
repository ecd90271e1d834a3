"""A minibatch as padded tensors, groups contiguous: what the log-prob path consumes (torch only)."""

from dataclasses import dataclass

import torch


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
