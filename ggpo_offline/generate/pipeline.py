"""Stage one: sample m responses per prompt, score them, and stream them into a Parquet pool."""

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from ggpo_offline import __version__
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import (
    EMBEDDED_MODEL,
    load_tokenizer,
    resolve_model_dir,
    tokenizer_sha256,
    weights_sha256,
)
from ggpo_offline.generate.datasets import load_dataset
from ggpo_offline.generate.engines import Engine, SamplingSettings, load_engine
from ggpo_offline.generate.prompts import Template, resolve_template, template_description
from ggpo_offline.generate.rewards import RewardScorer
from ggpo_offline.generate.rollout import (
    RolloutTotals,
    ScoredBatch,
    encode_prompts,
    engine_checks,
    prompt_token_limit,
    raise_first_failure,
    reward_description,
    sample_and_score,
    sampling_checks,
)
from ggpo_offline.pool.partial import PartialRun
from ggpo_offline.pool.schema import POOL_SCHEMA, SCHEMA_VERSION
from ggpo_offline.pool.writer import PoolWriter, check_output_path

DEFAULT_POOL = Path("pools/base.parquet")
# 500 prompts x 8 responses: the tiny preset uses 160 groups per seed, and `make demo` must fit in 12 min.
DEFAULT_ARITH_PROMPTS = 500


@dataclass(frozen=True)
class GenerateConfig:
    """Everything ``ggpo generate-pool`` needs; the defaults give the embedded default pool."""

    model: str | None = None
    """Local Hugging Face model folder; None = the tiny model shipped with the package."""
    dataset: str = "arith:train"
    """``arith[:train|test]``, a .jsonl/.json/.parquet file, or ``hf:NAME[:SPLIT]``."""
    problem_key: str | None = None
    answer_key: str | None = None
    solution_key: str | None = None
    num_prompts: int | None = None
    """How many prompts (files: the first N rows; arith: N drawn problems, default 500). None = all."""
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    engine: str = "vllm"
    dtype: str = "auto"
    """Engine weight dtype: auto (engine's choice), float32, bfloat16 or float16."""
    template: Template = "auto"
    """Prompt format: the tokenizer's chat template with the paper's prompts, or the plain template."""
    mixed_only: bool = False
    """Keep only groups with 0 < sum(r) < m (the paper's offline pool); default keeps all groups."""
    out: Path = DEFAULT_POOL
    overwrite: bool = False
    reward_workers: int = 2
    reward_timeout_s: float = 5.0
    batch_prompts: int = 256
    """Prompts per engine call; each finished batch becomes one durable part and one Parquet row group."""
    shard_index: int = 0
    """Which shard of the prompts to generate: dataset positions ``shard_index + k * num_shards``."""
    num_shards: int = 1
    """Into how many shards the prompts are cut (one job each); 1 = the whole dataset, no shard metadata."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallelism (GPUs per engine)."""
    data_parallel_size: int = 1
    """vLLM data parallelism (engine replicas), passed to ``vllm.LLM`` as given."""


@dataclass
class Progress(RolloutTotals):
    """Running totals reported after every batch (resumed parts included)."""

    prompts_resumed: int = 0
    """Prompts done by an earlier, interrupted run of the same command."""
    responses_resumed: int = 0
    prompts_done: int = 0
    prompts_total: int = 0
    groups_kept: int = 0
    mixed_groups: int = 0
    tokens: int = 0
    truncated: int = 0


def _validate_settings(config: GenerateConfig) -> None:
    raise_first_failure(
        sampling_checks(config.sampling, "--samples-per-prompt")
        + [(config.num_prompts is None or config.num_prompts >= 1, "--num-prompts must be >= 1")]
        + engine_checks(config.engine, config.dtype, config.template, config.reward_workers)
        + [
            (config.batch_prompts >= 1, "--batch-prompts must be >= 1"),
            (config.num_shards >= 1, f"--num-shards must be >= 1, got {config.num_shards}"),
            (
                0 <= config.shard_index < config.num_shards,
                f"--shard-index must be in 0..{config.num_shards - 1}, got {config.shard_index}",
            ),
            (config.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1"),
            (config.data_parallel_size >= 1, "--data-parallel-size must be >= 1"),
            (
                config.engine != "hf" or (config.tensor_parallel_size, config.data_parallel_size) == (1, 1),
                "--tensor-parallel-size and --data-parallel-size need --engine vllm (the hf engine runs on "
                "one device); use --shard-index/--num-shards to spread hf generation over jobs",
            ),
        ]
    )


def _dataset_kwargs(config: GenerateConfig) -> dict:
    limit = config.num_prompts
    if limit is None and config.dataset.split(":")[0] == "arith":
        limit = DEFAULT_ARITH_PROMPTS
    return {
        "problem_key": config.problem_key,
        "answer_key": config.answer_key,
        "solution_key": config.solution_key,
        "limit": limit,
        "seed": config.sampling.seed,
    }


def _rows(
    batch: ScoredBatch,
    group_ids: list[int],
    prompts: list[str],
    prompt_ids: list[list[int]],
    m: int,
    mixed_only: bool,
    progress: Progress,
) -> list[dict]:
    """Pool rows of one batch, whole groups only (contiguous), dropping all-equal groups if asked.

    A group's id is its prompt's position in the dataset, so shards of one run never share an id and
    their union has the ids of the unsharded run."""
    rows = []
    for offset, problem in enumerate(batch.problems):
        group_results = batch.results[offset * m : (offset + 1) * m]
        correct = sum(r.reward for r in group_results)
        mixed = 0 < correct < m
        if mixed_only and not mixed:
            continue
        progress.groups_kept += 1
        progress.mixed_groups += mixed
        for sample_idx, (sample, text, result) in enumerate(
            zip(batch.samples[offset], batch.responses[offset], group_results, strict=True)
        ):
            rows.append(
                {
                    "group_id": group_ids[offset],
                    "sample_idx": sample_idx,
                    "prompt_id": problem.prompt_id,
                    "source": problem.source,
                    "prompt": prompts[offset],
                    "prompt_token_ids": prompt_ids[offset],
                    "answer": problem.answer,
                    "response": text,
                    "response_token_ids": sample.token_ids,
                    "behavior_logprobs": sample.logprobs,
                    "finish_reason": sample.finish_reason,
                    "reward": result.reward,
                    "extracted_answer": result.extracted_answer,
                }
            )
            progress.responses += 1
            progress.reward_sum += result.reward
            progress.tokens += len(sample.token_ids)
            progress.truncated += sample.finish_reason == "length"
    return rows


def generate_pool(
    config: GenerateConfig,
    on_batch: Callable[[Progress], None] | None = None,
    engine: Engine | None = None,
) -> Path:
    """Write the pool described by ``config``; returns its path. Raises UserError on bad input.

    Every finished batch is stored durably in ``.<out name>.partial/`` beside ``out``; rerunning the
    same command after a crash resumes after the last stored batch (a command with other settings is
    refused). ``engine`` reuses an already started engine for the same model (it is left running); by
    default the engine named in ``config`` is started here and closed at the end.
    """
    _validate_settings(config)
    out = Path(config.out)
    check_output_path(out, config.overwrite)  # before any slow work
    kwargs = _dataset_kwargs(config)
    problems, dataset_meta = load_dataset(config.dataset, **kwargs)
    model_dir = resolve_model_dir(config.model)
    tokenizer = load_tokenizer(model_dir)
    template = resolve_template(tokenizer, config.template)
    sampling = config.sampling

    prompts, prompt_ids = encode_prompts(tokenizer, problems, template)
    prompt_limit = prompt_token_limit(model_dir, sampling.max_tokens)
    fits = [i for i, ids in enumerate(prompt_ids) if len(ids) <= prompt_limit]
    if not fits:
        raise UserError(f"every prompt is longer than {prompt_limit} tokens (model limit minus --max-tokens)")
    # Over all shards, so that every shard starts the same engine.
    max_model_len = max(len(prompt_ids[i]) for i in fits) + sampling.max_tokens
    in_shard = range(config.shard_index, len(problems), config.num_shards)
    keep = [i for i in fits if i % config.num_shards == config.shard_index]
    skipped_long = len(in_shard) - len(keep)
    if not keep:
        raise UserError(
            f"shard {config.shard_index} of {config.num_shards} has no prompt that fits "
            f"({len(problems)} prompts, {len(fits)} within {prompt_limit} tokens)"
        )

    identity = {"weights_sha256": weights_sha256(model_dir), "tokenizer_sha256": tokenizer_sha256(tokenizer)}
    partial = PartialRun(out, _run_settings(config, identity, dataset_meta, template), config.overwrite)
    progress = _resumed_progress(partial, len(keep))
    remaining = keep[progress.prompts_done :]

    owns_engine = engine is None
    if owns_engine:
        engine = load_engine(
            config.engine,
            model_dir,
            config.dtype,
            max_model_len,
            sampling.seed,
            tensor_parallel_size=config.tensor_parallel_size,
            data_parallel_size=config.data_parallel_size,
        )
    try:
        with RewardScorer(config.reward_workers, config.reward_timeout_s) as scorer:
            batch_started = time.monotonic()
            for batch in sample_and_score(
                engine,
                tokenizer,
                scorer,
                [problems[i] for i in remaining],
                [prompt_ids[i] for i in remaining],
                sampling,
                config.batch_prompts,
            ):
                chunk = remaining[batch.start : batch.start + len(batch.problems)]
                before = _counters(progress)
                rows = _rows(
                    batch,
                    chunk,
                    [prompts[i] for i in chunk],
                    [prompt_ids[i] for i in chunk],
                    sampling.m,
                    config.mixed_only,
                    progress,
                )
                progress.prompts_done += len(batch.problems)
                now = time.monotonic()
                counters = {key: value - before[key] for key, value in _counters(progress).items()}
                counters |= {
                    "timeouts": sum(r.status == "timeout" for r in batch.results),
                    "errors": sum(r.status == "error" for r in batch.results),
                    "seconds": now - batch_started,
                }
                batch_started = now
                partial.add_part(pa.Table.from_pylist(rows, schema=POOL_SCHEMA), counters)
                if on_batch is not None:
                    on_batch(progress)
        if progress.responses == 0:
            partial.remove()  # a complete run, nothing to resume
            raise UserError(
                "no group was kept (--mixed-only and no prompt had a mixed group); nothing written"
            )
        metadata = _metadata(
            config, model_dir, identity, tokenizer, engine, template, dataset_meta, progress, skipped_long
        )
        metadata["reward"].update(
            timeouts=int(partial.total("timeouts")), errors=int(partial.total("errors"))
        )
        metadata["generation_seconds"] = round(partial.total("seconds"), 2)
        if config.num_shards > 1:
            metadata["shard"] = {
                "index": config.shard_index,
                "count": config.num_shards,
                "dataset_prompts": len(problems),
            }
        with PoolWriter(out, config.overwrite) as writer:
            for table in partial.tables():
                writer.write_table(table)
            path = writer.close(metadata)
        partial.remove()  # only now: the pool holding the parts is in place
        return path
    finally:
        if owns_engine:
            engine.close()


COUNTERS = ("prompts_done", "groups_kept", "mixed_groups", "responses", "reward_sum", "tokens", "truncated")


def _counters(progress: Progress) -> dict:
    return {key: getattr(progress, key) for key in COUNTERS}


def _resumed_progress(partial: PartialRun, prompts_total: int) -> Progress:
    """The totals of the parts an interrupted run of the same command completed (zero when none)."""
    progress = Progress(prompts_total=prompts_total)
    for key in COUNTERS:
        value = partial.total(key)
        setattr(progress, key, value if key == "reward_sum" else int(value))
    progress.prompts_resumed, progress.responses_resumed = progress.prompts_done, progress.responses
    return progress


def _run_settings(config: GenerateConfig, identity: dict, dataset_meta: dict, template: str) -> dict:
    """What makes a stored batch reusable: same weights, tokenizer, prompts, sampling, filter and shard.
    Batch size, reward workers and the output path are left out: they do not change a prompt's rows."""
    return {
        "tool_version": __version__,
        **identity,
        **{f"dataset.{k}": v for k, v in dataset_meta.items() if k != "source"},
        **config.sampling.as_dict(),
        "template": template,
        "engine": config.engine,
        "dtype": config.dtype,
        "tensor_parallel_size": config.tensor_parallel_size,
        "data_parallel_size": config.data_parallel_size,
        "mixed_only": config.mixed_only,
        "reward_timeout_s": config.reward_timeout_s,
        "shard_index": config.shard_index,
        "num_shards": config.num_shards,
    }


def _metadata(
    config, model_dir, identity, tokenizer, engine, template, dataset_meta, progress, skipped_long
) -> dict:
    """The provenance stored in the pool footer under the ``ggpo_offline`` key."""
    described = engine.describe()
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "path": str(model_dir),
            "name": config.model or EMBEDDED_MODEL,
            "weights_sha256": identity["weights_sha256"],
        },
        "tokenizer": {"sha256": identity["tokenizer_sha256"], "class": type(tokenizer).__name__},
        "engine": {"name": described["name"], "version": described["version"]},
        "dtype": described["dtype"],
        "sampling": {
            **config.sampling.as_dict(),
            "logprobs_mode": described["logprobs_mode"],
            "seed_derivation": "per prompt: sha256('{seed}:{prompt_id}'), engine adds the sample index",
        },
        "dataset": dataset_meta,
        "prompt_template": template_description(template),
        "reward": reward_description(config.reward_timeout_s),
        "filter": {"mixed_only": config.mixed_only},
        "counts": {
            "prompts": progress.prompts_total,
            "skipped_long_prompts": skipped_long,
            "groups": progress.groups_kept,
            "responses": progress.responses,
            "mixed_groups": progress.mixed_groups,
            "mean_reward": progress.mean_reward,
            "tokens": progress.tokens,
            "truncated": progress.truncated,
        },
        "config": {k: v for k, v in asdict(config).items() if k not in ("sampling", "out", "overwrite")},
    }
