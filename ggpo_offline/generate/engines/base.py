"""What every engine takes and returns: sampling settings, per-prompt seeds, and samples cut at EOS."""

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

from ggpo_offline.core.settings import FRACTION, above, at_least, check_settings, setting

EngineName = Literal["vllm", "hf"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
"""An engine's weight dtype: auto (the dtype the weights are stored in, `stored_dtype`) or a torch dtype."""


def stored_dtype(model_dir: Path) -> str | None:
    """The weight dtype a model folder's config.json declares (``dtype``, or ``torch_dtype`` in older
    transformers), or None when it declares none."""
    import json

    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return None
    declared = json.loads(config.read_text())
    return declared.get("dtype") or declared.get("torch_dtype")


DEFAULT_MAX_TOKENS = 384
"""The response length limit unless told otherwise: room for the embedded model's longest responses (its
careful style writes up to ~330 tokens) within its 512 positions."""


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling settings of a pool (paper: temperature 1.0, top-p 1.0, no top-k)."""

    m: int = setting(
        8, "Responses per prompt (group size m).", flag="samples-per-prompt", short="m", valid=at_least(1)
    )
    temperature: float = setting(1.0, "Sampling temperature.", valid=above(0))
    top_p: float = setting(1.0, "Nucleus sampling threshold (1.0 = off).", valid=FRACTION)
    top_k: int = setting(0, "Top-k sampling (0 = off).", valid=at_least(0))
    max_tokens: int = setting(
        DEFAULT_MAX_TOKENS,
        "Response length limit in tokens; a response cut there keeps all its tokens (finish reason length).",
        valid=at_least(1),
    )
    seed: int = setting(0, "Global sampling seed (each prompt derives its own).", valid=at_least(0))

    def __post_init__(self) -> None:
        check_settings(self)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    """One response: generated token ids through the first EOS inclusive, and their behavior log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """'stop' when the response ended with EOS, 'length' when cut at max_tokens."""


def prompt_seed(seed: int, prompt_id: str) -> int:
    """A prompt's own sampling seed, so its samples do not depend on batching or sharding."""
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    # vLLM seeds sample i of a request with seed + i: 62 random bits keep those runs of seeds from
    # overlapping between prompts (31 bits would collide for some pair in a pool of ~10k prompts).
    return int.from_bytes(digest[:8], "little") >> 2


def cut_at_eos(token_ids: list[int], logprobs: list[float], eos_ids: set[int]) -> Sample:
    """SPEC mask semantics: keep generated tokens through the first EOS inclusive."""
    for position, token in enumerate(token_ids):
        if token in eos_ids:
            return Sample(list(token_ids[: position + 1]), list(logprobs[: position + 1]), "stop")
    return Sample(list(token_ids), list(logprobs), "length")


class Engine(Protocol):
    """A started generation engine."""

    def describe(self) -> dict:
        """Engine name, version, dtype and log-prob mode, for the pool metadata."""
        ...

    def generate(
        self, prompts: list[list[int]], seeds: list[int], sampling: SamplingSettings
    ) -> list[list[Sample]]:
        """``sampling.m`` samples for each tokenized prompt, prompt ``i`` seeded with ``seeds[i]``."""
        ...

    def load_weights(self, model_dir: Path) -> None:
        """Replace the weights in place with those of ``model_dir`` (same architecture and tokenizer)."""
        ...

    def close(self) -> None:
        """Release the engine's processes and memory."""
        ...
