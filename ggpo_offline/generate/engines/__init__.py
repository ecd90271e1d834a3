"""Generation engines: vLLM (default) and transformers ``generate`` (fallback), one interface."""

import typing
from pathlib import Path

from ggpo_offline.generate.engines.base import (
    Dtype,
    Engine,
    EngineName,
    Sample,
    SamplingSettings,
    prompt_seed,
)

ENGINES = typing.get_args(EngineName)


def load_engine(
    name: str,
    model_dir: Path,
    dtype: str,
    max_model_len: int,
    seed: int,
    gpu_memory_fraction: float | None = None,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
) -> Engine:
    """Start the named engine on a local model folder; vLLM is imported only here, on demand.

    ``gpu_memory_fraction`` caps vLLM's share of a GPU (weights + KV cache) when it shares the device with
    a learner; None = vLLM's default (0.9). It has no effect on CPU or for the hf engine.
    ``tensor_parallel_size`` and ``data_parallel_size`` go to ``vllm.LLM``; the hf engine refuses values > 1.
    """
    if name == "vllm":
        from ggpo_offline.generate.engines.vllm_engine import VllmEngine

        return VllmEngine(
            model_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            gpu_memory_fraction=gpu_memory_fraction,
            tensor_parallel_size=tensor_parallel_size,
            data_parallel_size=data_parallel_size,
        )
    if name == "hf":
        from ggpo_offline.generate.engines.hf_engine import HfEngine

        if (tensor_parallel_size, data_parallel_size) != (1, 1):
            from ggpo_offline.core.errors import UserError

            raise UserError(
                "tensor and data parallelism need the vllm engine (the hf engine runs on one device)"
            )

        return HfEngine(model_dir, dtype=dtype)
    from ggpo_offline.core.errors import UserError

    raise UserError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


__all__ = [
    "ENGINES",
    "Dtype",
    "Engine",
    "EngineName",
    "Sample",
    "SamplingSettings",
    "load_engine",
    "prompt_seed",
]
