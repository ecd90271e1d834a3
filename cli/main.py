"""The `ggpo` command: parses flags, calls one library function, prints results or one error line."""

import json
import sys
from pathlib import Path

import typer
from ggpo_cli import render
from ggpo_cli.config_flags import with_config_flags

from ggpo_offline.core.errors import UserError, one_line
from ggpo_offline.train.config import PER_RUN

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,  # help texts say "[default: ...]"; rich markup would swallow the brackets
    help="Offline fixed-pool RLVR experiments.",
)
pool_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Look at, check, score and merge pools."
)
POOL_ARGUMENT = "Pool file, or directory of shard files."
app.add_typer(pool_app, name="pool")


@app.command("generate-pool")
def generate_pool(
    model: str = typer.Option(
        None, help="Local Hugging Face model folder [default: the embedded tiny model]."
    ),
    dataset: str = typer.Option(
        "arith:train", help="arith[:train|test], a .jsonl/.json/.parquet file, or hf:NAME[:SPLIT]."
    ),
    problem_key: str = typer.Option(None, help="Problem column [default: problem, question or prompt]."),
    answer_key: str = typer.Option(None, help="Gold answer column [default: answer]."),
    solution_key: str = typer.Option(
        None, help="Solution column whose last \\boxed{} is the gold when there is no answer column."
    ),
    num_prompts: int = typer.Option(None, help="Number of prompts [default: arith 500, files all rows]."),
    samples_per_prompt: int = typer.Option(
        8, "--samples-per-prompt", "-m", help="Responses per prompt (group size m)."
    ),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling threshold (1.0 = off)."),
    top_k: int = typer.Option(0, help="Top-k sampling (0 = off)."),
    max_tokens: int = typer.Option(128, help="Response length limit in tokens."),
    seed: int = typer.Option(0, help="Global sampling seed (each prompt derives its own)."),
    engine: str = typer.Option("vllm", help="Generation engine: vllm or hf."),
    dtype: str = typer.Option("auto", help="Engine dtype: auto, float32, bfloat16, float16."),
    template: str = typer.Option("auto", help="Prompt format: auto, chat (paper prompts) or plain."),
    mixed_only: bool = typer.Option(False, "--mixed-only", help="Keep only groups with 0 < sum(r) < m."),
    out: Path = typer.Option(Path("pools/base.parquet"), help="Output pool file."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing pool file."),
    reward_workers: int = typer.Option(2, help="Worker processes for math-verify (0 = in-process)."),
    batch_prompts: int = typer.Option(256, help="Prompts per engine call; each batch is saved for resuming."),
    shard_index: int = typer.Option(0, help="Generate shard i: prompts at positions i, i + n, i + 2n, ..."),
    num_shards: int = typer.Option(1, help="Number of shards n (one job each; see `ggpo pool merge`)."),
    tensor_parallel_size: int = typer.Option(1, help="vLLM tensor parallelism (GPUs per engine)."),
    data_parallel_size: int = typer.Option(1, help="vLLM data parallelism (engine replicas)."),
) -> None:
    """Sample m responses per prompt, score them with math-verify and write a Parquet pool.

    Finished batches are kept in .<out name>.partial/ beside --out: rerunning the same command after a
    crash resumes there."""
    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig
    from ggpo_offline.generate.pipeline import generate_pool as run
    from ggpo_offline.pool.inspect import pool_summary

    sampling = SamplingSettings(samples_per_prompt, temperature, top_p, top_k, max_tokens, seed)
    config = GenerateConfig(
        model=model,
        dataset=dataset,
        problem_key=problem_key,
        answer_key=answer_key,
        solution_key=solution_key,
        num_prompts=num_prompts,
        sampling=sampling,
        engine=engine,
        dtype=dtype,
        template=template,
        mixed_only=mixed_only,
        out=out,
        overwrite=overwrite,
        reward_workers=reward_workers,
        batch_prompts=batch_prompts,
        shard_index=shard_index,
        num_shards=num_shards,
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
    )
    with render.GenerationProgress() as progress:
        path = run(config, on_batch=progress.update)
    render.print_summary(pool_summary(path))


@pool_app.command("inspect")
def pool_inspect(path: Path = typer.Argument(..., help=POOL_ARGUMENT)) -> None:
    """Counts, rewards, mixed groups, lengths, truncation and metadata of a pool."""
    from ggpo_offline.pool.inspect import pool_summary
    from ggpo_offline.pool.validate import validate_pool

    validate_pool(path)
    render.print_summary(pool_summary(path), with_metadata=True)


@pool_app.command("validate")
def pool_validate(path: Path = typer.Argument(..., help=POOL_ARGUMENT)) -> None:
    """Check schema, group layout, token/log-prob lengths, log-prob range and rewards."""
    from ggpo_offline.pool.validate import validate_pool

    print(validate_pool(path).summary())


@pool_app.command("score")
def pool_score(
    path: Path = typer.Argument(..., help=POOL_ARGUMENT),
    model: str = typer.Option(None, help="Initial policy folder [default: the pool's model]."),
) -> None:
    """Score the pool's mixed groups under the initial model once (the π0 cache every run shares)."""
    from ggpo_offline.train.pi0_cache import ensure_pi0_cache

    with render.ScoreProgress() as progress:
        cache = ensure_pi0_cache(path, model, on_progress=progress.update)
    print(f"π0 cache: {cache.path}")


@pool_app.command("merge")
def pool_merge(
    directory: Path = typer.Argument(..., help="Directory of shard files (one sharded run)."),
    out: Path = typer.Option(..., help="Pool file to write."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file."),
) -> None:
    """Validate a shard directory and write it as one pool file, groups in ascending group id order."""
    from ggpo_offline.pool.merge import merge_pool

    print(f"wrote {merge_pool(directory, out, overwrite)}")


@app.command("train")
@with_config_flags()
def train(
    preset: str = typer.Option(None, help="paper-offline (SPEC defaults) or tiny (embedded model, ~40 s)."),
    config: Path = typer.Option(None, help="TOML/YAML/JSON file of settings (flags override it)."),
    nproc: int = typer.Option(
        None, help="Train in N processes on this machine (torchrun; DDP, or FSDP2 with --fsdp) [default: 1]."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out from its last checkpoint."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run folder."),
    **settings,
) -> None:
    """Replay a pool deterministically through one learner, logging drift, K3 and ESS to MLflow.

    Every training setting has a flag (below, after --overwrite); a --config file takes the same names."""
    from ggpo_offline.train.config import resolve_config
    from ggpo_offline.train.distributed import is_main_process
    from ggpo_offline.train.trainer import train as run

    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    resolved = resolve_config(preset, config, **settings)
    if not is_main_process():  # a torchrun worker other than rank 0: rank 0 speaks for the job
        run(resolved, resume=resume, overwrite=overwrite)
        return
    render.print_config(resolved)
    if nproc is not None and nproc > 1:
        from ggpo_offline.train.launch import launch

        result = launch(resolved, nproc, resume, overwrite, render.TrainingProgress)
    else:
        with render.TrainingProgress(resolved.updates) as progress:
            result = run(
                resolved,
                resume=resume,
                overwrite=overwrite,
                on_update=progress.update,
                on_eval=progress.evaluated,
            )
    render.print_training_result(result)


@app.command("eval")
def evaluate(
    model: str = typer.Option(
        None, help="Local Hugging Face model folder [default: the embedded tiny model]."
    ),
    dataset: list[str] = typer.Option(
        None,
        help="A benchmark: arith[:train|test], a .jsonl/.json/.parquet file or hf:NAME[:SPLIT]; "
        "repeat for a suite [default: arith:test].",
    ),
    problem_key: str = typer.Option(None, help="Problem column [default: problem, question or prompt]."),
    answer_key: str = typer.Option(None, help="Gold answer column [default: answer]."),
    solution_key: str = typer.Option(
        None, help="Solution column whose last \\boxed{} is the gold when there is no answer column."
    ),
    num_problems: int = typer.Option(
        None, help="Problems per benchmark [default: arith 500, files all rows]."
    ),
    n: int = typer.Option(32, "--num-samples", "-n", help="Responses per problem (the n of mean@n, pass@k)."),
    ks: str = typer.Option(
        "1,4,8,16,32", "--ks", "-k", help="Comma-separated k of pass@k (k > n is skipped)."
    ),
    pool: Path = typer.Option(None, help="Take sampling settings and prompt template from this pool."),
    temperature: float = typer.Option(None, help="Sampling temperature [default: the pool's, else 1.0]."),
    top_p: float = typer.Option(None, help="Nucleus threshold [default: the pool's, else 1.0 = off]."),
    top_k: int = typer.Option(None, help="Top-k [default: the pool's, else 0 = off]."),
    max_tokens: int = typer.Option(None, help="Response length limit [default: the pool's, else 128]."),
    seed: int = typer.Option(0, help="Global sampling seed (each problem derives its own)."),
    engine: str = typer.Option("vllm", help="Generation engine: vllm or hf."),
    dtype: str = typer.Option(
        None, help="Engine dtype: auto, float32, bfloat16, float16 [default: the pool's, else auto]."
    ),
    template: str = typer.Option(
        None, help="Prompt format: auto, chat or plain [default: the pool's, else auto]."
    ),
    reward_workers: int = typer.Option(2, help="Worker processes for math-verify (0 = in-process)."),
    out: Path = typer.Option(None, help="Write the JSON report (per-problem counts included) here."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file."),
) -> None:
    """Sample n responses per benchmark problem; report mean@n and pass@k per benchmark and for the suite."""
    from ggpo_offline.evaluate.evaluator import DEFAULT_DATASETS, EvalConfig
    from ggpo_offline.evaluate.evaluator import evaluate as run

    config = EvalConfig(
        model=model,
        datasets=tuple(dataset) if dataset else DEFAULT_DATASETS,
        problem_key=problem_key,
        answer_key=answer_key,
        solution_key=solution_key,
        num_problems=num_problems,
        n=n,
        ks=_ks(ks),
        pool=pool,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        seed=seed,
        engine=engine,
        dtype=dtype,
        template=template,
        reward_workers=reward_workers,
        out=out,
        overwrite=overwrite,
    )
    with render.EvalProgress() as progress:
        report = run(config, on_progress=progress.update)
    render.print_eval_report(report, out)


def _ks(value: str) -> tuple[int, ...]:
    return _numbers(value, "-k")


def _numbers(value: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise UserError(f"{flag} must be comma-separated whole numbers, got {value!r}") from None


@app.command("compare")
@with_config_flags(exclude=PER_RUN)
def compare(
    pool: Path = typer.Option(Path("pools/base.parquet"), help="Pool every run replays."),
    methods: str = typer.Option("grpo,grpo-tis,agro,ggpo", help="Comma-separated learners."),
    seeds: str = typer.Option("42,1234,2027", help="Comma-separated training seeds."),
    preset: str = typer.Option(None, help="Training preset of every run: paper-offline or tiny."),
    config: Path = typer.Option(None, help="TOML/YAML/JSON file of training settings shared by all runs."),
    out: Path = typer.Option(None, help="Report folder [default: reports/<pool name>/]."),
    rerun: bool = typer.Option(False, "--rerun", help="Train every run again instead of reusing it."),
    **settings,
) -> None:
    """Train every method x seed on one pool with one data plan per seed; write tables and figures.

    Every training setting but the per-run ones has a flag (as in ggpo train); without --eval-every the
    runs are evaluated every U/5 updates, as in the paper."""
    from ggpo_offline.compare.comparison import CompareConfig
    from ggpo_offline.compare.comparison import compare as run

    compare_config = CompareConfig(
        pool=pool,
        methods=tuple(part.strip() for part in methods.split(",") if part.strip()),
        seeds=_numbers(seeds, "--seeds"),
        preset=preset,
        config_file=config,
        settings=settings,
        out=out,
        rerun=rerun,
    )
    with render.CompareProgress() as progress:
        result = run(
            compare_config, on_run=progress.start_run, on_update=progress.update, on_eval=progress.evaluated
        )
    render.print_compare_result(result)


@app.command("build-tiny-model")
def build_tiny_model(
    out: Path = typer.Option(..., help="Folder to write the model into."),
    seed: int = typer.Option(0, help="Training seed."),
    steps: int = typer.Option(2000, help="Optimizer steps."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into an existing non-empty folder."),
) -> None:
    """Rebuild the embedded tiny model from its recipe (tokenizer, task, supervised pretraining)."""
    from ggpo_offline.organism.tiny import build_tiny_model as build

    if out.exists() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out} exists and is not empty; pass --overwrite to write into it")
    stats = build(out, seed=seed, steps=steps)
    print(
        f"wrote {out}: " + ", ".join(f"{k}={v}" for k, v in stats.items() if not isinstance(v, (list, dict)))
    )


@app.command("measure-styles")
def measure_styles(
    model: Path = typer.Option(None, help="Model folder [default: the embedded tiny model]."),
    num_problems: int = typer.Option(256, help="Arith test problems."),
    n: int = typer.Option(8, help="Responses per problem."),
    seed: int = typer.Option(0, help="Sampling seed."),
    forced: bool = typer.Option(True, "--forced/--no-forced", help="Also sample with each style forced."),
    json_out: Path = typer.Option(None, "--json", help="Also write the full report (per level) here."),
) -> None:
    """Each style's share and accuracy in the model's samples, and its accuracy when forced (the ceiling)."""
    from ggpo_offline.core.model_io import tiny_model_dir
    from ggpo_offline.organism.tiny import measure_styles as measure

    model_dir = model if model is not None else tiny_model_dir()
    if not (model_dir / "config.json").is_file():
        raise UserError(f"--model {model_dir}: not a model folder (no config.json)")
    report = measure(model_dir, n_problems=num_problems, m=n, seed=seed, forced=forced)
    render.print_style_report(report)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")


def main(args: list[str] | None = None) -> None:
    """Console entry point: a UserError becomes one line on stderr and exit code 1."""
    try:
        app(args=args, standalone_mode=False)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    except OSError as error:
        # The writers name their target themselves (UserError); this catches the rest of the environment's
        # failures (a full disk under metrics.jsonl, ...). Python's message names the file.
        print(f"error: {one_line(error)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Exception as error:  # click's usage errors
        import click

        if isinstance(error, click.ClickException):
            error.show()
            sys.exit(error.exit_code)
        if isinstance(error, click.exceptions.Abort):
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
