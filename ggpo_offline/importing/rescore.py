"""Log-probs of imported responses under the pool's model: behaviour log-probs for text-only sources, and the
consistency check of stored ones."""

from dataclasses import dataclass
from pathlib import Path

import torch

RESPONSES_PER_FORWARD = 32


@dataclass
class Scorer:
    """The model in float32 on the CPU (or the first GPU), scoring responses as the learner's log-probs do
    (`train.logprobs.response_logprobs`: softmax(logits / T), full vocabulary)."""

    model_dir: Path
    pad_id: int

    def __post_init__(self) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        self.model = model.to(self.device).eval()

    @torch.no_grad()
    def logprobs(self, rows: list[dict], temperature: float) -> list[list[float]]:
        """log π(a_t | x, a_<t) of every response token of ``rows`` (pool rows: prompt and response ids)."""
        from ggpo_offline.train.logprobs import response_logprobs
        from ggpo_offline.train.minibatch import minibatch_from_rows

        scored = []
        for start in range(0, len(rows), RESPONSES_PER_FORWARD):
            chunk = [
                row | {"behavior_logprobs": [0.0] * len(row["response_token_ids"]), "reward": 0.0}
                for row in rows[start : start + RESPONSES_PER_FORWARD]
            ]
            batch = minibatch_from_rows(chunk, list(range(len(chunk))), 1, self.pad_id)
            logp = response_logprobs(self.model, batch, temperature=temperature)[0].cpu()
            scored += [logp[i, : len(row["response_token_ids"])].tolist() for i, row in enumerate(chunk)]
        return scored
