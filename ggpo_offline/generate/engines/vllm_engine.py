"""The vLLM engine: batched sampling with the sampled tokens' log-probs from the processed distribution."""

import os
from pathlib import Path

import torch

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import eos_token_ids
from ggpo_offline.generate.engines.base import Sample, SamplingSettings, cut_at_eos, stored_dtype

# Log-probs of the distribution actually sampled from (after temperature / top-p / top-k).
LOGPROBS_MODE = "processed_logprobs"


def engine_dtype(model_dir: Path, dtype: str) -> str:
    """vLLM's dtype for ours: "auto" keeps float32 weights in float32. vLLM's own "auto" runs them in bf16 on
    CPUs with bf16 units (fp16/bf16 on GPUs), so a float32 model's pool would depend on the processor; weights
    stored in bf16/fp16 (real checkpoints) are left to vLLM, which keeps them."""
    if dtype == "auto" and stored_dtype(model_dir) == "float32":
        return "float32"
    return dtype


def prepare_environment(gpu_memory_fraction: float | None = None) -> dict:
    """Environment and engine options for this platform; the user's own environment settings win.

    vLLM's CPU build refuses to start without a KV-cache size (1 GiB here), and on CPU one process
    (engine core and worker in-process) starts in seconds instead of a minute of process spawning.
    Eager mode: on CPU, torch.compile costs ~50 s at start for no gain on small models.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its warnings are about CPU tuning, not results
    if torch.cuda.is_available():
        return {} if gpu_memory_fraction is None else {"gpu_memory_utilization": gpu_memory_fraction}
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # Small KV blocks let the m samples of a short prompt share its cached prefix (1.5x faster here).
    return {"distributed_executor_backend": "uni", "block_size": 32}


def repack_tied_lm_head(model: torch.nn.Module) -> None:
    """Refresh the CPU LM head's packed weights after an in-place reload.

    On CPU, vLLM 0.32 packs each linear layer's weight for its GEMM kernel once after loading. A head
    tied to the embedding is not reloaded itself (only the shared embedding is), so without this its
    packed copy keeps the old weights: logits then differ from a fresh start on the same checkpoint.
    """
    head = getattr(model, "lm_head", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and head is not None and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)


class VllmEngine:
    """``vllm.LLM`` over a local model folder; prompts go in as token ids, so both engines see the same."""

    def __init__(
        self,
        model_dir: Path,
        dtype: str,
        max_model_len: int,
        seed: int,
        gpu_memory_fraction: float | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
    ):
        platform_options = prepare_environment(gpu_memory_fraction)
        if tensor_parallel_size > 1:
            platform_options.pop("distributed_executor_backend", None)  # "uni" runs one worker only
        from vllm import LLM

        self.dtype = dtype
        self.eos_ids = eos_token_ids(model_dir)
        try:
            self.llm = LLM(
                model=str(model_dir),
                tokenizer=str(model_dir),
                dtype=engine_dtype(model_dir, dtype),
                seed=seed,
                max_model_len=max_model_len,
                logprobs_mode=LOGPROBS_MODE,
                disable_log_stats=True,
                enforce_eager=True,
                tensor_parallel_size=tensor_parallel_size,
                data_parallel_size=data_parallel_size,
                # A chunked prefill makes vLLM draw and then rewind a seeded request's random numbers, which
                # the CPU generator cannot do (RuntimeError "CPU Generator does not use offset"); whole
                # prefills also keep each prompt's sample stream independent of how requests were batched.
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(max_model_len, 8192),
                **platform_options,
            )
        except ValueError as exc:  # vLLM's own check of the engine arguments (parallel sizes, memory, ...)
            hint = ""
            if data_parallel_size > 1:
                hint = (
                    f"; for {data_parallel_size} replicas run {data_parallel_size} generate-pool jobs with "
                    f"--shard-index i --num-shards {data_parallel_size}, one per GPU set"
                )
            raise UserError(f"vLLM refused the engine settings: {str(exc).splitlines()[0]}{hint}") from None

    def describe(self) -> dict:
        import vllm  # the distribution is `vllm` on GPUs and `vllm-cpu` here; the module knows its version

        resolved = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        return {
            "name": "vllm",
            "version": vllm.__version__,
            "dtype": resolved,
            "logprobs_mode": LOGPROBS_MODE,
        }

    def generate(
        self, prompts: list[list[int]], seeds: list[int], sampling: SamplingSettings
    ) -> list[list[Sample]]:
        from vllm import SamplingParams, TokensPrompt

        params = [
            SamplingParams(
                n=sampling.m,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_tokens=sampling.max_tokens,
                seed=seed,
                logprobs=0,  # 0 = only the sampled token's log-prob
                detokenize=False,  # response text is decoded by our tokenizer, identically for both engines
            )
            for seed in seeds
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        groups = []
        for output in outputs:
            samples = []
            for completion in sorted(output.outputs, key=lambda c: c.index):
                token_ids = list(completion.token_ids)
                logprobs = [
                    step[token].logprob for step, token in zip(completion.logprobs, token_ids, strict=True)
                ]
                samples.append(cut_at_eos(token_ids, logprobs, self.eos_ids))
            groups.append(samples)
        return groups

    def load_weights(self, model_dir: Path) -> None:
        # vLLM's in-place reload (no restart); the prefix cache holds KV entries of the old weights.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_dir)})
        if not torch.cuda.is_available():
            self.llm.apply_model(repack_tied_lm_head)
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(
            getattr(engine, "engine_core", None), "shutdown", None
        )
        if shutdown is not None:
            shutdown()
        del self.llm
