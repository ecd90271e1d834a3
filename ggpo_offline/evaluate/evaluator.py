"""Evaluation (SPEC "Evaluation", paper Appendix C.1): mean@n and pass@k per benchmark and for the suite."""

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from ggpo_offline import __version__
from ggpo_offline.core.errors import UserError, write_json
from ggpo_offline.core.model_io import (
    load_tokenizer,
    model_name,
    resolve_model_dir,
    tokenizer_sha256,
    weights_sha256,
)
from ggpo_offline.evaluate.benchmark_scores import aggregate, reported_ks
from ggpo_offline.evaluate.config import DEFAULT_ARITH_PROBLEMS, EvalConfig
from ggpo_offline.evaluate.eval_report import EvalReport, EvalSettings, EvaluatedModel, check_report_path
from ggpo_offline.evaluate.generated import GeneratedText, PoolSupport
from ggpo_offline.generate.datasets import dataset_answer_rule, load_dataset
from ggpo_offline.generate.engines import Engine, SamplingSettings, load_engine
from ggpo_offline.generate.problems import Problem
from ggpo_offline.generate.prompts import Template, resolve_template, template_description
from ggpo_offline.generate.rewards import AnswerRule, RewardScorer
from ggpo_offline.generate.rollout import (
    RolloutTotals,
    encode_prompts,
    prompt_token_limit,
    reward_description,
    sample_and_score,
)
from ggpo_offline.pool.source import read_pool_info

DATASET_SEED = 0
"""Seed of the arith draw: fixed, so that every sampling seed is evaluated on the same problems."""
POOL_SETTINGS = ("temperature", "top_p", "top_k", "max_tokens")


@dataclass
class EvalProgress(RolloutTotals):
    """Running totals reported after every engine call (``mean_reward`` = fraction correct so far)."""

    problems_done: int = 0
    problems_total: int = 0


@dataclass(frozen=True)
class _Benchmark:
    """One dataset's problems that fit the model, with their token ids."""

    name: str
    problems: list[Problem]
    prompt_ids: list[list[int]]
    dataset: dict
    skipped_long_prompts: int
    answer_rule: AnswerRule


def resolve_sampling(config: EvalConfig) -> tuple[SamplingSettings, Template, str]:
    """The sampling settings (``m = n``), template and engine dtype used: each field given in ``config``
    wins, then the pool's value when ``config.pool`` is set, then the default."""
    defaults = SamplingSettings()
    values: dict = {name: getattr(defaults, name) for name in POOL_SETTINGS}
    values |= {"template": "auto", "dtype": "auto"}
    if config.pool is not None:
        values |= _pool_settings(Path(config.pool))
    values |= {name: getattr(config, name) for name in values if getattr(config, name) is not None}
    template, dtype = values.pop("template"), values.pop("dtype")
    return SamplingSettings(m=config.n, seed=config.seed, **values), template, dtype


def _pool_settings(pool: Path) -> dict:
    if not pool.exists():
        raise UserError(f"{pool}: no such pool file or directory")
    info = read_pool_info(pool)
    settings = {name: getattr(info.sampling, name) for name in POOL_SETTINGS}
    settings |= {"template": info.prompt_template.kind, "dtype": info.dtype}
    names = {"template": "prompt_template.kind", "dtype": "dtype"}
    missing = [names.get(name, f"sampling.{name}") for name, value in settings.items() if value is None]
    if missing:
        raise UserError(f"{pool}: the pool metadata has no {', '.join(missing)}")
    return settings


class Evaluator:
    """One evaluation protocol (benchmarks, sampling, reward) applied to one model after another.

    Benchmarks are loaded and tokenized once and the engine is started once, on the first model; each
    later model's weights are loaded into the running engine. A model whose weights were already
    evaluated (same sha256) is not sampled again: the protocol is deterministic, so the counts are reused.
    """

    def __init__(self, config: EvalConfig, engine: Engine | None = None):
        """``engine`` borrows an already started engine holding ``config.model``: it is left running,
        with those weights loaded again. By default the engine named in ``config`` is started on first
        use and closed by ``close``."""
        self.config = config
        self.sampling, self.template_choice, self.dtype = resolve_sampling(config)
        self.datasets = [load_dataset(spec, **_dataset_kwargs(config, spec)) for spec in config.datasets]
        self.names = _benchmark_names([meta for _, meta in self.datasets])
        self.rules = [
            dataset_answer_rule(spec, config.columns.answer_rule, problems)
            for spec, (problems, _) in zip(config.datasets, self.datasets, strict=True)
        ]
        self._engine = engine
        self._owns_engine = engine is None
        self._engine_model = None if engine is None else resolve_model_dir(config.model)
        self._borrowed_model = self._engine_model
        self._tokenizer = None
        self._benchmarks: list[_Benchmark] = []
        self._scorer: RewardScorer | None = None  # kept across models: its workers take seconds to start
        self._support: PoolSupport | None = None  # the pool's, read on first use
        self._done: dict[str, tuple] = {}
        self._lent_results: dict[EvalConfig, dict[str, tuple]] = {}

    def lend(self, config: EvalConfig) -> "Evaluator":
        """An Evaluator of another protocol (``config``'s benchmarks) on this one's engine, started if needed;
        closing it gives the engine back holding the weights this one expects. Evaluators lent for one
        protocol share their results, so weights evaluated once (each run's base model) are not sampled
        again, and the pool's support, once read, is not read again for the same pool."""
        lent = (
            Evaluator(config)
            if self._engine is None
            else Evaluator(replace(config, model=str(self._engine_model)), self._engine)
        )
        lent._done = self._lent_results.setdefault(replace(config, model=None), {})
        if config.pool == self.config.pool:
            lent._support = self._support
        return lent

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def evaluate(
        self,
        model: str | Path | None = None,
        on_progress: Callable[[EvalProgress], None] | None = None,
    ) -> EvalReport:
        """The report of ``model`` (a local folder; None = ``config.model``)."""
        model_dir = resolve_model_dir(self.config.model if model is None else str(model))
        weights = weights_sha256(model_dir)
        self._prepare(model_dir)
        if weights not in self._done:
            self._load(model_dir)
            if self._scorer is None:
                self._scorer = RewardScorer(self.config.reward_workers, self.config.reward_timeout_s)
            generated = GeneratedText(self._pool_support())
            counts, reward, progress = _count_correct(
                self._engine, self._tokenizer, self._scorer, self._benchmarks, self.sampling, self.config,
                on_progress, generated,
            )  # fmt: skip
            described = self._engine.describe()
            self._done[weights] = (counts, reward, progress.elapsed_s, described, generated.to_dict())
        counts, reward, seconds, described, generated = self._done[weights]
        return _report(
            self.config,
            counts,
            self._benchmarks,
            self.sampling,
            model_dir,
            weights,
            self._template,
            described,
            reward,
            seconds,
            generated,
        )

    def _pool_support(self) -> PoolSupport | None:
        """The support of ``config.pool``'s responses, which the novelty diagnostics compare with."""
        if self.config.pool is not None and self._support is None:
            self._support = PoolSupport.of_pool(Path(self.config.pool))
        return self._support

    def close(self) -> None:
        """Stop the reward workers and the engine, or give a borrowed engine its first weights back."""
        if self._scorer is not None:
            self._scorer.close()
            self._scorer = None
        if self._engine is not None:
            if self._owns_engine:
                self._engine.close()
            elif self._engine_model != self._borrowed_model:
                self._engine.load_weights(self._borrowed_model)
        self._engine = None

    def _prepare(self, model_dir: Path) -> None:
        """Tokenize the benchmarks with the first model's tokenizer; later models must share it."""
        tokenizer = load_tokenizer(model_dir)
        if self._tokenizer is not None:
            if tokenizer_sha256(tokenizer) != tokenizer_sha256(self._tokenizer):
                raise UserError(f"{model_dir} has a different tokenizer than the models evaluated before it")
            return
        self._tokenizer = tokenizer
        self._template = resolve_template(tokenizer, self.template_choice)
        prompt_limit = prompt_token_limit(model_dir, self.sampling.max_tokens)
        self._benchmarks = [
            _benchmark(name, problems, meta, rule, tokenizer, self._template, prompt_limit)
            for name, (problems, meta), rule in zip(self.names, self.datasets, self.rules, strict=True)
        ]

    def _load(self, model_dir: Path) -> None:
        if self._engine is None:
            longest = max(len(ids) for b in self._benchmarks for ids in b.prompt_ids)
            self._engine = load_engine(
                self.config.engine,
                model_dir,
                self.dtype,
                longest + self.sampling.max_tokens,
                self.sampling.seed,
                self.config.gpu_memory_fraction,
            )
        elif self._engine_model != model_dir:
            self._engine.load_weights(model_dir)
        self._engine_model = model_dir


def evaluate(
    config: EvalConfig,
    engine: Engine | None = None,
    on_progress: Callable[[EvalProgress], None] | None = None,
) -> EvalReport:
    """Sample ``n`` responses per problem of every benchmark, score them with the pool's reward and
    return the report (also written to ``config.out`` when set).

    ``engine`` reuses an already started engine, which must hold ``config.model`` (it is left running);
    by default the engine named in ``config`` is started here and closed at the end. Raises UserError on
    bad input.
    """
    if config.out is not None:
        check_report_path(Path(config.out), config.overwrite)  # before any slow work
    with Evaluator(config, engine) as evaluator:
        report = evaluator.evaluate(config.model, on_progress)
    if config.out is not None:
        write_json(report.to_dict(), Path(config.out))
    return report


def _count_correct(engine, tokenizer, scorer, benchmarks, sampling, config, on_progress, generated):
    """Correct responses per problem ``{benchmark: {prompt_id: c}}``, the reward description with each
    benchmark's answer rule and the timeout/error counts, and the final progress; all benchmarks share one
    stream of engine calls. Every sample is also added to ``generated``."""
    problems = [p for b in benchmarks for p in b.problems]
    prompt_ids = [ids for b in benchmarks for ids in b.prompt_ids]
    rules = [b.answer_rule for b in benchmarks for _ in b.problems]
    owner = [b.name for b in benchmarks for _ in b.problems]
    counts: dict[str, dict[str, int]] = {b.name: {} for b in benchmarks}
    progress = EvalProgress(problems_total=len(problems))
    timeouts_before, errors_before = scorer.timeouts, scorer.errors
    for batch in sample_and_score(
        engine, tokenizer, scorer, problems, prompt_ids, sampling, config.batch_prompts, rules
    ):
        for samples in batch.samples:
            generated.add(samples)
        for offset, problem in enumerate(batch.problems):
            group = batch.results[offset * sampling.m : (offset + 1) * sampling.m]
            correct = sum(result.reward == 1.0 for result in group)
            counts[owner[batch.start + offset]][problem.prompt_id] = correct
            progress.reward_sum += correct
        progress.problems_done += len(batch.problems)
        progress.responses += len(batch.results)
        if on_progress is not None:
            on_progress(progress)
    reward = reward_description(config.reward_timeout_s, rules)
    reward["answer_rule_by_benchmark"] = {b.name: b.answer_rule for b in benchmarks}
    reward.update(timeouts=scorer.timeouts - timeouts_before, errors=scorer.errors - errors_before)
    return counts, reward, progress


def _dataset_kwargs(config: EvalConfig, spec: str) -> dict:
    limit = config.num_problems
    if limit is None and spec.split(":")[0] == "arith":
        limit = DEFAULT_ARITH_PROBLEMS
    return {
        **config.columns.column_keys(),
        "limit": limit,
        "seed": DATASET_SEED,
    }


def benchmark_name(dataset_meta: dict) -> str:
    """A benchmark's name: a file's stem (``math500``), else its source with ``-`` (``arith-test``)."""
    spec = dataset_meta["spec"]
    if spec.split(":")[0] in ("arith", "hf"):
        return dataset_meta["source"].replace(":", "-").replace("/", "-")
    return Path(spec).stem


def _benchmark_names(dataset_metas: list[dict]) -> list[str]:
    names: dict[str, str] = {}
    for meta in dataset_metas:
        name = benchmark_name(meta)
        if name in names:
            raise UserError(
                f"--dataset {names[name]} and {meta['spec']} are both named {name!r}; rename one file"
            )
        names[name] = meta["spec"]
    return list(names)


def _benchmark(name, problems, dataset_meta, rule, tokenizer, template, prompt_limit) -> _Benchmark:
    _, prompt_ids = encode_prompts(tokenizer, problems, template)
    keep = [i for i, ids in enumerate(prompt_ids) if len(ids) <= prompt_limit]
    if not keep:
        raise UserError(
            f"every prompt of {dataset_meta['spec']} is longer than {prompt_limit} tokens "
            "(model limit minus --max-tokens)"
        )
    return _Benchmark(
        name=name,
        problems=[problems[i] for i in keep],
        prompt_ids=[prompt_ids[i] for i in keep],
        dataset=dataset_meta,
        skipped_long_prompts=len(problems) - len(keep),
        answer_rule=rule,
    )


def _report(
    config, counts, benchmarks, sampling, model_dir, weights, template, described, reward, seconds, generated
) -> EvalReport:
    scores, suite = aggregate(counts, config.n, config.ks)
    return EvalReport(
        n=config.n,
        ks=tuple(reported_ks(config.ks, config.n)),
        benchmarks={
            b.name: replace(scores[b.name], dataset=b.dataset, skipped_long_prompts=b.skipped_long_prompts)
            for b in benchmarks
        },
        suite=suite,
        settings=EvalSettings(
            model=EvaluatedModel(str(model_dir), model_name(model_dir), weights),
            sampling=sampling,
            pool=None if config.pool is None else str(config.pool),
            prompt_template=template_description(template),
            engine={"name": described["name"], "version": described["version"]},
            dtype=described["dtype"],
            reward=reward,
            dataset_seed=DATASET_SEED,
            tool_version=__version__,
        ),
        run={
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(seconds, 2),
        },
        generated=generated,
    )
