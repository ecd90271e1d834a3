"""Stage one: sample m responses per prompt, score them, and stream them into a Parquet pool."""

import dataclasses
import time
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
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
from ggpo_offline.core.one_writer import one_writer
from ggpo_offline.core.settings import leaf_values, leaves
from ggpo_offline.core.stopwatch import Stopwatch
from ggpo_offline.generate.config import DEFAULT_ARITH_PROMPTS, GenerateConfig
from ggpo_offline.generate.datasets import dataset_answer_rule, load_dataset
from ggpo_offline.generate.engines import Engine, load_engine
from ggpo_offline.generate.problems import Problem
from ggpo_offline.generate.prompts import resolve_template, template_description
from ggpo_offline.generate.rewards import AnswerRule, RewardScorer
from ggpo_offline.generate.rollout import (
    RolloutTotals,
    ScoredBatch,
    encode_prompts,
    prompt_token_limit,
    reward_description,
    sample_and_score,
)
from ggpo_offline.jobs.config import LaunchConfig
from ggpo_offline.pool.info import (
    PoolCounts,
    PoolDataset,
    PoolEngine,
    PoolFilter,
    PoolInfo,
    PoolModel,
    PoolReward,
    PoolSampling,
    PoolShard,
    PoolTemplate,
    PoolTokenizer,
)
from ggpo_offline.pool.partial import PartCounts, PartialRun, partial_dir
from ggpo_offline.pool.schema import POOL_SCHEMA, SCHEMA_VERSION
from ggpo_offline.pool.writer import PoolWriter, check_output_path


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


def dataset_kwargs(config: GenerateConfig) -> dict:
    """`load_dataset`'s keyword arguments for ``config``'s prompts (arith's default size when none given)."""
    limit = config.num_prompts
    if limit is None and config.dataset.split(":")[0] == "arith":
        limit = DEFAULT_ARITH_PROMPTS
    return {
        **config.columns.column_keys(),
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
    keep_groups: int | None = None,
) -> tuple[list[dict], int]:
    """Pool rows of one batch, whole groups only (contiguous), dropping all-equal groups if asked, and how
    many of its prompts they used: all, unless the run's ``keep_groups``-th group is among them (the
    prompts after it are left unused, so that a later pool can start there).

    A group's id is its prompt's position in the dataset, so shards of one run never share an id and
    their union has the ids of the unsharded run."""
    rows = []
    for offset, problem in enumerate(batch.problems):
        if progress.groups_kept == keep_groups:
            return rows, offset
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
    return rows, len(batch.problems)


def generate_pool(
    config: GenerateConfig,
    on_batch: Callable[[Progress], None] | None = None,
    engine: "Engine | KeptEngine | None" = None,
    stopwatch: Stopwatch | None = None,
) -> Path:
    """Write the pool described by ``config``; returns its path. Raises UserError on bad input.

    Every finished batch is stored durably in ``.<out name>.partial/`` beside ``out``; rerunning the
    same command after a crash resumes after the last stored batch (a command with other settings is
    refused). ``engine`` reuses an already started engine for the same model, or a `KeptEngine` (either is
    left running); by default the engine named in ``config`` is started here and closed at the end.
    ``stopwatch`` gets the time spent sampling, waiting for rewards and writing (`sample_and_score`).
    """
    out = Path(config.out)
    # A second command on the same --out (or a Slurm task requeued while its predecessor still writes) is
    # refused; the resume state is the one writer's, and goes with it once the pool is in place.
    rule = f"{out} has one generate-pool"
    with one_writer(partial_dir(out), rule=rule, then="run it again", temporary=True):
        return _generate_pool(config, out, on_batch, engine, Stopwatch() if stopwatch is None else stopwatch)


def _generate_pool(
    config: GenerateConfig,
    out: Path,
    on_batch: Callable[[Progress], None] | None,
    engine: "Engine | KeptEngine | None",
    stopwatch: Stopwatch,
) -> Path:
    check_output_path(out, config.overwrite)  # before any slow work; held: an earlier holder may have ended
    model_dir = resolve_model_dir(config.model)
    problems, dataset_meta, tokenizer, template, prompts = _encoded(config, model_dir)
    rule = dataset_answer_rule(config.dataset, config.columns.answer_rule, problems)

    identity = {"weights_sha256": weights_sha256(model_dir), "tokenizer_sha256": tokenizer_sha256(tokenizer)}
    settings = _run_settings(config, identity, dataset_meta, template, rule)
    partial = PartialRun(out, settings, config.overwrite)
    progress = _resumed_progress(partial, len(prompts.keep))

    owns_engine, scorer = engine is None, None
    if owns_engine:
        engine = _start_engine(config, model_dir, prompts.max_model_len)
    elif isinstance(engine, KeptEngine):
        engine, scorer = engine.for_pool(config, model_dir, prompts.max_model_len), engine.scorer(config)
    try:
        _sample_and_store(
            config, engine, tokenizer, prompts, rule, partial, progress, on_batch, stopwatch, scorer
        )
        footer = _footer(
            config, model_dir, identity, tokenizer, engine, template, dataset_meta, rule, progress, prompts
        )
        footer = _with_run_totals(footer, config, partial, dataset_prompts=len(problems))
        with stopwatch.timing("writing"):
            return _write_pool(out, config.overwrite, partial, footer)
    finally:
        if owns_engine:
            engine.close()


def _encoded(config: GenerateConfig, model_dir: Path) -> tuple[list[Problem], dict, object, str, "_Prompts"]:
    """The dataset of ``config`` (its problems and metadata), ``model_dir``'s tokenizer and template, and
    the prompts this shard samples."""
    problems, dataset_meta = load_dataset(config.dataset, **dataset_kwargs(config))
    tokenizer = load_tokenizer(model_dir)
    template = resolve_template(tokenizer, config.template)
    prompts = _shard_prompts(config, problems, tokenizer, template, model_dir)
    return problems, dataset_meta, tokenizer, template, prompts


@dataclass(frozen=True)
class _Prompts:
    """The dataset's problems encoded as prompts, and which of them this shard samples (from --first-prompt
    on)."""

    problems: list[Problem]
    texts: list[str]
    token_ids: list[list[int]]
    keep: list[int]
    """Dataset positions of this shard's prompts that fit the model, in order."""
    skipped_long: int
    """This shard's prompts left out as too long."""
    max_model_len: int
    """The longest fitting prompt over all shards plus --max-tokens, so that every shard starts the same
    engine."""


def _shard_prompts(
    config: GenerateConfig, problems: list[Problem], tokenizer, template: str, model_dir: Path
) -> _Prompts:
    """Encode the problems from --first-prompt on (a round of a training run starts deep into its dataset);
    keep this shard's prompts within the model's prompt limit (refused when none)."""
    first = config.first_prompt
    if first >= len(problems):
        raise UserError(f"--first-prompt {first} is past the dataset's last prompt ({len(problems)} prompts)")
    texts, token_ids = encode_prompts(tokenizer, problems[first:], template)
    texts, token_ids = [""] * first + texts, [[]] * first + token_ids
    prompt_limit = prompt_token_limit(model_dir, config.sampling.max_tokens)
    fits = [i for i in range(first, len(problems)) if len(token_ids[i]) <= prompt_limit]
    if not fits:
        raise UserError(
            f"every prompt from --first-prompt {first} is longer than {prompt_limit} tokens (model limit "
            "minus --max-tokens)"
        )
    max_model_len = max(len(token_ids[i]) for i in fits) + config.sampling.max_tokens
    in_shard = range(first + config.shard_index, len(problems), config.num_shards)
    keep = [i for i in fits if (i - first) % config.num_shards == config.shard_index]
    if not keep:
        raise UserError(
            f"shard {config.shard_index} of {config.num_shards} has no prompt that fits "
            f"({len(problems) - first} prompts from --first-prompt {first}, {len(fits)} of them within "
            f"{prompt_limit} tokens)"
        )
    return _Prompts(problems, texts, token_ids, keep, len(in_shard) - len(keep), max_model_len)


def _start_engine(config: GenerateConfig, model_dir: Path, max_model_len: int) -> Engine:
    return load_engine(
        config.engine,
        model_dir,
        config.dtype,
        max_model_len,
        config.sampling.seed,
        tensor_parallel_size=config.tensor_parallel_size,
        data_parallel_size=config.data_parallel_size,
    )


class KeptEngine:
    """One engine for pools sampled by successive checkpoints of a model: started for the first pool, given
    each next pool's weights in place (`Engine.load_weights`), started again only for a longer prompt; and
    one set of reward workers for them all (spawned per pool, they cost a run that samples every update
    ~0.7 core-seconds a round)."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.model_dir: Path | None = None
        self.max_model_len = 0
        self._scorer: RewardScorer | None = None

    def for_pool(self, config: GenerateConfig, model_dir: Path, max_model_len: int) -> Engine:
        if self.engine is not None and max_model_len > self.max_model_len:
            self.close()
        if self.engine is None:
            self.engine, self.max_model_len = _start_engine(config, model_dir, max_model_len), max_model_len
        elif model_dir != self.model_dir:
            self.engine.load_weights(model_dir)
        self.model_dir = model_dir
        return self.engine

    def warm(self, config: GenerateConfig) -> None:
        """Start the engine and the reward workers that ``config``'s pool needs before it is asked for; a
        later pool's weights replace its model's in place."""
        model_dir = resolve_model_dir(config.model)
        self.for_pool(config, model_dir, _encoded(config, model_dir)[-1].max_model_len)
        self.scorer(config)

    def scorer(self, config: GenerateConfig) -> RewardScorer:
        """The reward workers of ``config``'s pool: the kept ones, unless its worker settings differ."""
        settings = (config.reward_workers, config.reward_timeout_s)
        if self._scorer is not None and settings != (self._scorer.workers, self._scorer.timeout_s):
            self._scorer.close()
            self._scorer = None
        if self._scorer is None:
            self._scorer = RewardScorer(*settings)
        return self._scorer

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self._scorer is not None:
            self._scorer.close()
        self.engine, self.model_dir, self._scorer = None, None, None


def _sample_and_store(
    config: GenerateConfig,
    engine: Engine,
    tokenizer,
    prompts: _Prompts,
    rule: AnswerRule,
    partial: PartialRun,
    progress: Progress,
    on_batch: Callable[[Progress], None] | None,
    stopwatch: Stopwatch,
    kept_scorer: RewardScorer | None = None,
) -> None:
    """Sample and score (answer ``rule``) the prompts no earlier run stored, storing each finished batch as
    a part of ``partial`` with the counters it adds, until --keep-groups groups are kept when it is given;
    refused when no group (or fewer than --keep-groups) was kept. ``kept_scorer``: reward workers left
    running after it (`KeptEngine.scorer`); else its own are started and closed."""
    wanted = config.keep_groups
    remaining = [] if progress.groups_kept == wanted else prompts.keep[progress.prompts_done :]
    with (
        RewardScorer(config.reward_workers, config.reward_timeout_s)
        if kept_scorer is None
        else nullcontext(kept_scorer)
    ) as scorer:
        batch_started = time.monotonic()
        batches = sample_and_score(
            engine,
            tokenizer,
            scorer,
            [prompts.problems[i] for i in remaining],
            [prompts.token_ids[i] for i in remaining],
            config.sampling,
            config.batch_prompts,
            rule,
            stopwatch,
        )
        with closing(batches):  # stopped at --keep-groups: the batch sampled ahead is dropped
            for batch in batches:
                chunk = remaining[batch.start : batch.start + len(batch.problems)]
                before = _counts(progress)
                rows, used = _rows(
                    batch,
                    chunk,
                    [prompts.texts[i] for i in chunk],
                    [prompts.token_ids[i] for i in chunk],
                    config.sampling.m,
                    config.mixed_only,
                    progress,
                    wanted,
                )
                progress.prompts_done += used
                now = time.monotonic()
                results = batch.results[: used * config.sampling.m]
                counts = dataclasses.replace(
                    _counts(progress) - before,
                    timeouts=sum(r.status == "timeout" for r in results),
                    errors=sum(r.status == "error" for r in results),
                    seconds=now - batch_started,
                )
                batch_started = now
                with stopwatch.timing("writing"):
                    partial.add_part(pa.Table.from_pylist(rows, schema=POOL_SCHEMA), counts)
                if on_batch is not None:
                    on_batch(progress)
                if progress.groups_kept == wanted:
                    break
        if kept_scorer is not None:  # the next pool's batches would queue behind this one's dropped scores
            with stopwatch.timing("scoring"):
                scorer.drain()
    _refuse_too_few_groups(config, prompts, partial, progress)


class TooFewGroups(UserError):
    """Every prompt was sampled and fewer groups than asked were kept; ``dataset_prompts``: how many the
    dataset gave (fewer than --num-prompts: it has no more)."""

    def __init__(self, message: str, dataset_prompts: int):
        super().__init__(message)
        self.dataset_prompts = dataset_prompts


def _refuse_too_few_groups(
    config: GenerateConfig, prompts: _Prompts, partial: PartialRun, progress: Progress
) -> None:
    """Every prompt sampled: refused, nothing written, when no group, or fewer than --keep-groups, was kept
    (no rerun of the command can keep more: it needs more prompts)."""
    kept, wanted = progress.groups_kept, config.keep_groups
    if kept > 0 and (wanted is None or kept == wanted):
        return
    partial.remove()
    if kept == 0:
        message = "no group was kept (--mixed-only and no prompt had a mixed group); nothing written"
        raise TooFewGroups(message, len(prompts.problems))
    sampled = f"{len(prompts.keep)} prompt{'s' if len(prompts.keep) > 1 else ''}"
    raise TooFewGroups(
        f"--keep-groups {wanted}: the {sampled} from --first-prompt {config.first_prompt} kept {kept} "
        f"group{'s' if kept > 1 else ''}; nothing written (give more prompts with --num-prompts)",
        len(prompts.problems),
    )


def _with_run_totals(
    footer: PoolInfo, config: GenerateConfig, partial: PartialRun, dataset_prompts: int
) -> PoolInfo:
    """``footer`` with the totals known once every part is stored (resumed ones included): reward timeouts
    and errors, the generation time, and a shard's place in the dataset."""
    totals = partial.totals
    reward = dataclasses.replace(footer.reward, timeouts=int(totals.timeouts), errors=int(totals.errors))
    shard = PoolShard(index=config.shard_index, count=config.num_shards, dataset_prompts=dataset_prompts)
    return dataclasses.replace(
        footer,
        reward=reward,
        generation_seconds=round(totals.seconds, 2),
        shard=shard if config.num_shards > 1 else PoolShard(),
    )


def _write_pool(out: Path, overwrite: bool, partial: PartialRun, footer: PoolInfo) -> Path:
    """The stored parts as one pool with ``footer`` stored; then the parts are removed."""
    with PoolWriter(out, overwrite) as writer:
        for table in partial.tables():
            writer.write_table(table)
        path = writer.close(footer)
    partial.remove()  # only now: the pool holding the parts is in place
    return path


COUNTED = ("prompts_done", "groups_kept", "mixed_groups", "responses", "reward_sum", "tokens", "truncated")
"""The running totals a stored batch adds to (`PartCounts`' fields that `Progress` also keeps)."""


def _counts(progress: Progress) -> PartCounts:
    return PartCounts(**{name: getattr(progress, name) for name in COUNTED})


def _resumed_progress(partial: PartialRun, prompts_total: int) -> Progress:
    """The totals of the parts an interrupted run of the same command completed (zero when none)."""
    totals = partial.totals
    progress = Progress(prompts_total=prompts_total, **{name: getattr(totals, name) for name in COUNTED})
    progress.prompts_resumed, progress.responses_resumed = progress.prompts_done, progress.responses
    return progress


def _run_settings(
    config: GenerateConfig, identity: dict, dataset_meta: dict, template: str, rule: AnswerRule
) -> dict:
    """What makes a stored batch reusable: same weights, tokenizer, prompts, sampling, answer rule, filter
    and shard. Batch size, reward workers and the output path are left out: they do not change a prompt's
    rows."""
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
        "first_prompt": config.first_prompt,
        "keep_groups": config.keep_groups,
        "reward_timeout_s": config.reward_timeout_s,
        "answer_rule": rule,
        "shard_index": config.shard_index,
        "num_shards": config.num_shards,
    }


SEED_DERIVATION = "per prompt: sha256('{seed}:{prompt_id}'), engine adds the sample index"


def _footer(
    config, model_dir, identity, tokenizer, engine, template, dataset_meta, rule, progress, prompts
) -> PoolInfo:
    """The pool's footer record (stored under the ``ggpo_offline`` key), but the run totals."""
    described = engine.describe()
    return PoolInfo(
        schema_version=SCHEMA_VERSION,
        tool_version=__version__,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        model=PoolModel(
            path=str(model_dir),
            name=config.model or EMBEDDED_MODEL,
            weights_sha256=identity["weights_sha256"],
            policy_version=config.policy_version,
        ),
        tokenizer=PoolTokenizer(sha256=identity["tokenizer_sha256"], class_name=type(tokenizer).__name__),
        engine=PoolEngine(name=described["name"], version=described["version"]),
        dtype=described["dtype"],
        sampling=PoolSampling(
            **config.sampling.as_dict(),
            logprobs_mode=described["logprobs_mode"],
            learner_temperature=config.learner_temperature,
            other={"seed_derivation": SEED_DERIVATION},
        ),
        dataset=PoolDataset.from_dict(dataset_meta),
        prompt_template=PoolTemplate.from_dict(template_description(template)),
        reward=PoolReward(answer_rule=rule, other=reward_description(config.reward_timeout_s, [rule])),
        filter=PoolFilter(mixed_only=config.mixed_only),
        counts=PoolCounts(
            prompts=progress.prompts_done,
            skipped_long_prompts=prompts.skipped_long,
            groups=progress.groups_kept,
            responses=progress.responses,
            mixed_groups=progress.mixed_groups,
            mean_reward=progress.mean_reward,
            tokens=progress.tokens,
            truncated=progress.truncated,
        ),
        config=recorded_settings(config),
    )


def recorded_settings(config: GenerateConfig) -> dict:
    """The settings of the pool's ``config`` record: every one but the sampling settings and the learner's
    temperature (recorded apart, in ``sampling``), the policy version (in ``model``), where the pool is
    written and where it was generated (the launcher's: the same pool wherever it ran), flat as the flags
    name them."""
    left_out = {field.name for field in dataclasses.fields(config.sampling)}
    left_out |= {"learner_temperature", "policy_version", "out", "overwrite"}
    left_out |= set(leaves(LaunchConfig))
    return {name: value for name, value in leaf_values(config).items() if name not in left_out}
