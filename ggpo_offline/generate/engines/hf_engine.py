"""The transformers engine: ``generate`` with sampling, one prompt (m samples) at a time, no padding."""

from importlib.metadata import version
from pathlib import Path

import torch

from ggpo_offline.core.model_io import eos_token_ids
from ggpo_offline.generate.engines.base import Sample, SamplingSettings, cut_at_eos

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# compute_transition_scores(normalize_logits=True) renormalizes the processed scores, i.e. the
# distribution actually sampled from (the same meaning as vLLM's processed_logprobs).
LOGPROBS_MODE = "processed_logprobs"


class HfEngine:
    """Fallback engine; each prompt's m samples share one unpadded batch and the prompt's own seed."""

    def __init__(self, model_dir: Path, dtype: str = "auto"):
        self.dtype = dtype
        self.load_weights(model_dir)
        self.eos_ids = eos_token_ids(model_dir)
        self.pad_id = self.model.config.pad_token_id
        if self.pad_id is None:
            self.pad_id = min(self.eos_ids)

    def load_weights(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        torch_dtype = "auto" if self.dtype == "auto" else DTYPES[self.dtype]
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype).eval()

    def describe(self) -> dict:
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        return {
            "name": "hf",
            "version": version("transformers"),
            "dtype": dtype,
            "logprobs_mode": LOGPROBS_MODE,
        }

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], seeds: list[int], sampling: SamplingSettings
    ) -> list[list[Sample]]:
        groups = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            input_ids = torch.tensor([prompt] * sampling.m, dtype=torch.long)
            # A forked RNG: evaluating inside training must not move the trainer's random stream.
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                output = self.model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    do_sample=True,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,  # explicit: transformers otherwise applies top_k=50
                    repetition_penalty=1.0,
                    max_new_tokens=sampling.max_tokens,
                    eos_token_id=sorted(self.eos_ids),
                    pad_token_id=self.pad_id,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
            scores = self.model.compute_transition_scores(
                output.sequences, output.scores, normalize_logits=True
            )
            generated = output.sequences[:, len(prompt) :]
            groups.append(
                [
                    cut_at_eos(tokens.tolist(), logprobs.float().tolist(), self.eos_ids)
                    for tokens, logprobs in zip(generated, scores, strict=True)
                ]
            )
        return groups

    def close(self) -> None:
        del self.model
