"""The `ggpo` command: parses flags, calls one library function, prints results or one error line."""

import json
import sys
from pathlib import Path

import typer
from ggpo_cli import terminal
from ggpo_cli.config_flags import with_config_flags

from ggpo_offline.compare.config import (
    ArcConfig,
    CompareConfig,
    LadderConfig,
    RefreshConfig,
    RegimesConfig,
    TuneConfig,
)
from ggpo_offline.core.errors import UserError, one_line
from ggpo_offline.core.settings import config_from
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.generate.config import GenerateConfig
from ggpo_offline.importing.config import ImportConfig
from ggpo_offline.organism.config import RehearsalModelConfig, StylesConfig, TinyModelConfig
from ggpo_offline.pool.config import MergeConfig
from ggpo_offline.train.config import PER_RUN, ScoreConfig, TrainConfig, TrainOptions
from ggpo_offline.train.training_presets import PRESETS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,  # help texts say "[default: ...]"; rich markup would swallow the brackets
    help="Offline fixed-pool RLVR experiments.",
)
pool_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Look at, check, score, merge and import pools."
)
POOL_ARGUMENT = "Pool file, or directory of shard files."
app.add_typer(pool_app, name="pool")


@app.command("generate-pool")
@with_config_flags(GenerateConfig)
def generate_pool(settings: dict) -> None:
    """Sample m responses per prompt, score them with math-verify and write a Parquet pool.

    Finished batches are kept in .<out name>.partial/ beside --out: rerunning the same command after a
    crash resumes there."""
    from ggpo_offline.generate.pipeline import generate_pool as run
    from ggpo_offline.pool.inspect import pool_summary

    config = config_from(GenerateConfig, settings)
    if config.launch.launcher == "slurm":
        from ggpo_offline.generate.shard_jobs import ShardsSubmitted, generate_on_slurm

        path = generate_on_slurm(config, terminal.JobProgress())
        if isinstance(path, ShardsSubmitted):
            print(f"submitted {path.jobs} shard job(s); the same command follows them and then merges:")
            print(f"  {path.command}")
            return
    else:
        with terminal.GenerationProgress() as progress:
            path = run(config, on_batch=progress.update)
    terminal.print_summary(pool_summary(path))


@pool_app.command("inspect")
def pool_inspect(path: Path = typer.Argument(..., help=POOL_ARGUMENT)) -> None:
    """Counts, rewards, mixed groups, lengths, truncation and metadata of a pool."""
    from ggpo_offline.pool.inspect import pool_summary
    from ggpo_offline.pool.validate import validate_pool

    validate_pool(path)
    terminal.print_summary(pool_summary(path), with_metadata=True)


@pool_app.command("validate")
def pool_validate(path: Path = typer.Argument(..., help=POOL_ARGUMENT)) -> None:
    """Check schema, group layout, token/log-prob lengths, log-prob range and rewards."""
    from ggpo_offline.pool.validate import validate_pool

    print(validate_pool(path).summary())


@pool_app.command("score")
@with_config_flags(ScoreConfig)
def pool_score(path: Path = typer.Argument(..., help=POOL_ARGUMENT), *, settings: dict) -> None:
    """Score the pool's mixed groups under the initial model once (the π0 cache every run shares), and
    measure its sampler against the learner there."""
    from ggpo_offline.train.pi0_cache import ensure_pi0_cache
    from ggpo_offline.train.sampler_mismatch import pool_mismatch

    config = config_from(ScoreConfig, settings)
    with terminal.ScoreProgress() as progress:
        pool, cache = ensure_pi0_cache(path, config.model, on_progress=progress.update)
    print(f"π0 cache: {cache.path}")
    terminal.print_sampler_mismatch(pool_mismatch(pool, cache))


@pool_app.command("merge")
@with_config_flags(MergeConfig)
def pool_merge(
    directory: Path = typer.Argument(..., help="Directory of shard files (one sharded run)."),
    *,
    settings: dict,
) -> None:
    """Validate a shard directory and write it as one pool file, groups in ascending group id order."""
    from ggpo_offline.pool.merge import merge_pool

    config = config_from(MergeConfig, settings)
    print(f"wrote {merge_pool(directory, config.out, config.overwrite)}")


@pool_app.command("import")
@with_config_flags(ImportConfig)
def pool_import(
    sources: list[Path] = typer.Argument(..., help="Files written by the source, or folders holding them."),
    *,
    settings: dict,
) -> None:
    """Write a pool from rollouts another tool wrote: NeMo-RL, prime-rl, TRL rollout_func output, vLLM server
    responses or the generic record (README, "Bring your own rollouts")."""
    from ggpo_offline.importing.importer import import_pool

    with terminal.ImportProgress() as progress:
        result = import_pool(config_from(ImportConfig, settings), sources, on_progress=progress.update)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {result.path}: {result.groups} groups x {result.m} = {result.responses} responses")


@app.command("train")
@with_config_flags(TrainConfig, presets=PRESETS)
@with_config_flags(TrainOptions, into="options")
def train(options: dict, settings: dict) -> None:
    """Replay a pool deterministically through one learner, logging drift, K3 and ESS to MLflow.

    Every training setting has a flag (below, after --overwrite); a --config file takes the same names."""
    from ggpo_offline.train.distributed import is_main_process
    from ggpo_offline.train.dry_run import plan_run
    from ggpo_offline.train.trainer import train as run
    from ggpo_offline.train.training_presets import resolve_config

    how = config_from(TrainOptions, options)
    resolved = resolve_config(how.preset, how.config_file, **settings)
    if not is_main_process():  # a torchrun worker other than rank 0: rank 0 speaks for the job
        run(resolved, resume=how.resume, overwrite=how.overwrite, timeouts=how.timeouts)
        return
    # Bad input is refused before the table, by the checks the dry run shows; the pool is read once.
    plan = plan_run(
        resolved,
        resume=how.resume,
        overwrite=how.overwrite,
        processes=how.nproc or 1,
        resume_if_any=how.resume_if_any,
    )
    resume, overwrite = plan.action == "resume", plan.action == "replace"
    pool = plan.inputs.pool
    terminal.print_config(resolved)
    if how.dry_run:
        terminal.print_run_plan(plan)
        return
    if plan.action == "reuse":
        print(f"{resolved.run_dir} holds this run, finished: nothing to train")
        return
    if how.nproc is not None and how.nproc > 1:
        from ggpo_offline.train.launch import launch

        result = launch(resolved, how.nproc, resume, overwrite, terminal.TrainingProgress, how.timeouts)
    else:
        with terminal.TrainingProgress(resolved.updates) as progress:
            result = run(
                resolved,
                resume=resume,
                overwrite=overwrite,
                on_update=progress.update,
                on_eval=progress.evaluated,
                timeouts=how.timeouts,
                pool=pool,
            )
    terminal.print_training_result(result)


@app.command("eval")
@with_config_flags(EvalConfig)
def evaluate(settings: dict) -> None:
    """Sample n responses per benchmark problem; report mean@n and pass@k per benchmark and for the suite."""
    from ggpo_offline.evaluate.evaluator import evaluate as run

    config = config_from(EvalConfig, settings)
    with terminal.EvalProgress() as progress:
        report = run(config, on_progress=progress.update)
    terminal.print_eval_report(report, config.out)


@app.command("compare")
@with_config_flags(TrainConfig, exclude=PER_RUN, presets=PRESETS)
@with_config_flags(CompareConfig, exclude=("settings",), into="options")
def compare(options: dict, settings: dict) -> None:
    """Train every method x seed on one pool with one data plan per seed; write tables and figures.

    Every training setting but the per-run ones has a flag (as in ggpo train); without --eval-every the
    runs are evaluated every U/5 updates, as in the paper."""
    from ggpo_offline.compare.budget import budgeted
    from ggpo_offline.compare.comparison import compare as run
    from ggpo_offline.compare.comparison import plan_compare

    compare_config, allocations = budgeted(config_from(CompareConfig, {**options, "settings": settings}))
    terminal.print_allocations(compare_config, allocations)
    if compare_config.dry_run:
        terminal.print_compare_plan(plan_compare(compare_config))
        return
    terminal.print_compare_result(run(compare_config, report=terminal.JobProgress()))


@app.command("arc-report")
@with_config_flags(ArcConfig)
def arc_report(settings: dict) -> None:
    """The offline arc's report (make arc) from runs that several compares trained side by side."""
    from ggpo_offline.compare.arc import arc_report as write

    out = write(config_from(ArcConfig, settings))
    print(f"wrote {out}/README.md")


@app.command("ladder-report")
@with_config_flags(LadderConfig)
def ladder_report(settings: dict) -> None:
    """The staleness ladder (make ladder): compares at several --sync-every N beside the offline one."""
    from ggpo_offline.compare.ladder import ladder_report as write

    out = write(config_from(LadderConfig, settings))
    print(f"wrote {out}/README.md")


@app.command("regimes-report")
@with_config_flags(RegimesConfig)
def regimes_report(settings: dict) -> None:
    """The corrections under mismatch and lag (make regimes): each against none, one family a condition."""
    from ggpo_offline.compare.regimes import regimes_report as write

    out = write(config_from(RegimesConfig, settings))
    print(f"wrote {out}/README.md")


@app.command("tune-report")
@with_config_flags(TuneConfig)
def tune_report(settings: dict) -> None:
    """Each learner's learning rate chosen on validation from compares at several rates (make tune-lr)."""
    from ggpo_offline.compare.tuning import tune_report as write

    out = write(config_from(TuneConfig, settings))
    print(f"wrote {out}/README.md")


@app.command("report")
@with_config_flags(RefreshConfig)
def report(settings: dict) -> None:
    """Render a report folder's README again from its report.json and counts, with today's statistics."""
    from ggpo_offline.compare.render_folder import render_folder

    for path in render_folder(config_from(RefreshConfig, settings)):
        print(f"wrote {path}")


@app.command("build-tiny-model")
@with_config_flags(TinyModelConfig)
def build_tiny_model(settings: dict) -> None:
    """Rebuild the embedded tiny model from its recipe (tokenizer, task, supervised pretraining)."""
    config = config_from(TinyModelConfig, settings)
    _refuse_a_full_folder(config.out, config.overwrite)  # before torch is imported: a refusal is instant
    from ggpo_offline.organism.tiny import build_tiny_model as build

    _print_built(config.out, build(config.out, seed=config.seed, steps=config.steps))


@app.command("build-rehearsal-model")
@with_config_flags(RehearsalModelConfig)
def build_rehearsal_model(settings: dict) -> None:
    """Build the rehearsal model in seconds: a small Qwen3 with a byte-level BPE and Qwen's chat template."""
    config = config_from(RehearsalModelConfig, settings)
    _refuse_a_full_folder(config.out, config.overwrite)  # before torch is imported: a refusal is instant
    from ggpo_offline.organism.rehearsal import build_rehearsal_model as build

    _print_built(config.out, build(config.out, seed=config.seed))


def _refuse_a_full_folder(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out} exists and is not empty; pass --overwrite to write into it")


def _print_built(out: Path, stats: dict) -> None:
    print(
        f"wrote {out}: " + ", ".join(f"{k}={v}" for k, v in stats.items() if not isinstance(v, (list, dict)))
    )


@app.command("measure-styles")
@with_config_flags(StylesConfig)
def measure_styles(settings: dict) -> None:
    """Each style's share and accuracy in the model's samples, and its accuracy when forced (the ceiling)."""
    from ggpo_offline.core.model_io import tiny_model_dir
    from ggpo_offline.organism.card import check_card, write_card_section
    from ggpo_offline.organism.measure import measure_styles as measure

    config = config_from(StylesConfig, settings)
    model_dir = config.model if config.model is not None else tiny_model_dir()
    if not (model_dir / "config.json").is_file():
        raise UserError(f"--model {model_dir}: not a model folder (no config.json)")
    if config.card is not None:
        check_card(config.card, config.forced)
    report = measure(
        model_dir,
        n_problems=config.num_problems,
        m=config.n,
        seed=config.seed,
        forced=config.forced,
        split=config.split,
    )
    terminal.print_style_report(report)
    if config.json_out is not None:
        config.json_out.write_text(json.dumps(report, indent=2) + "\n")
    if config.card is not None:
        write_card_section(config.card, report, "ggpo " + " ".join(sys.argv[1:]))
        print(f"wrote the measured section of {config.card}")


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
    except typer.Abort:
        sys.exit(1)
    except Exception as error:
        # click's usage errors (a missing or mistyped flag); typer vendors its own click, so they are
        # recognized by what they can do rather than by click's class
        if callable(getattr(error, "show", None)) and isinstance(getattr(error, "exit_code", None), int):
            error.show()
            sys.exit(error.exit_code)
        raise


if __name__ == "__main__":
    main()
