"""Terminal output of the CLI: progress bars, the pool summary table and the evaluation table."""

import json
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from ggpo_offline.evaluate.eval_report import EvalReport
    from ggpo_offline.pool.inspect import PoolSummary
    from ggpo_offline.train.sampler_mismatch import SamplerMismatch

console = Console(stderr=True)  # progress bars
stdout = Console(soft_wrap=True)  # results; long paths stay on one line


class _LazyProgress:
    """A rich progress bar that appears with the first report, so that input errors found before any
    work print as one clean line."""

    label = ""

    def __enter__(self):
        self._bar = None
        return self

    def _report(self, completed: int, total: int | None, **fields) -> None:
        if self._bar is None:
            self._bar = Progress(
                TextColumn(self.label),
                BarColumn(),
                MofNCompleteColumn(),
                *[TextColumn(f"{{task.fields[{name}]}}") for name in fields],
                TimeElapsedColumn(),
                console=console,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=total, **fields)
        self._bar.update(self._task, completed=completed, total=total, **fields)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


class GenerationProgress(_LazyProgress):
    """Prompts done, responses/s and the mean reward so far."""

    label = "generating"

    def update(self, progress) -> None:
        if self._bar is None and progress.prompts_resumed:
            console.print(
                f"resuming: {progress.prompts_resumed} of {progress.prompts_total} prompts were done"
            )
        rate = (progress.responses - progress.responses_resumed) / max(progress.elapsed_s, 1e-9)
        self._report(
            progress.prompts_done,
            progress.prompts_total,
            rate=f"prompts  {rate:.0f} responses/s",
            reward=f"reward {progress.mean_reward:.3f}",
        )


def print_summary(summary: "PoolSummary", with_metadata: bool = False) -> None:
    """The `pool inspect` table (and the footer as indented JSON when asked)."""
    info = summary.info
    table = Table(title=summary.path, show_header=False)
    # Pools made before answer rules existed record none; their rewards came from math-verify.
    answer_rule = info.reward.answer_rule or "not recorded (an older pool: math-verify)"
    sampling = ("m", "temperature", "top_p", "top_k", "max_tokens", "seed")
    rows = [
        ("model", info.model.name),
        ("engine", f"{info.engine.name} {info.engine.version} ({info.dtype})"),
        ("dataset", info.dataset.spec),
        ("answer rule", answer_rule),
        ("sampling", ", ".join(f"{k}={getattr(info.sampling, k)}" for k in sampling)),
        ("groups", f"{summary.groups:,}"),
        ("responses", f"{summary.responses:,}"),
        ("mean reward", f"{summary.mean_reward:.4f}"),
        ("mixed groups", f"{summary.mixed_groups:,} ({summary.mixed_frac:.1%})"),
        (
            "all-wrong / all-right groups",
            f"{summary.all_wrong_groups:,} / {summary.all_right_groups:,}",
        ),
        ("response tokens", f"{summary.tokens:,} (mean length {summary.mean_length:.1f})"),
        (
            "length p10 / p50 / p90 / p99 / max",
            " / ".join(map(str, (summary.p10, summary.p50, summary.p90, summary.p99, summary.max_length))),
        ),
        ("truncated (finish_reason=length)", f"{summary.truncated_frac:.2%}"),
        ("reward timeouts / errors", f"{info.reward.timeouts} / {info.reward.errors}"),
    ]
    seconds = info.generation_seconds
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):  # metadata may be hand-edited
        rows.append(
            ("generation time", f"{seconds:.0f} s ({summary.tokens / max(seconds, 1e-9):,.0f} tokens/s)")
        )
    for key, value in rows:
        table.add_row(key, str(value))
    stdout.print(table)
    if with_metadata:
        stdout.print_json(json.dumps(info.to_metadata(), sort_keys=True))


def print_config(config) -> None:
    """The resolved training configuration, printed at start: the settings the chosen learner reads (the
    registry's `Learner.keep_read`)."""
    table = Table(title="resolved config", show_header=False)
    for key, value in config.learner.keep_read(config.to_dict()).items():
        if key == "ref_refresh" and value is None:
            value = "never (the initial model stays the reference)"
        table.add_row(key, str(value))
    table.add_row("run folder", str(config.run_dir))
    stdout.print(table)


class ScoreProgress(_LazyProgress):
    """Mixed groups scored under the initial model."""

    label = "scoring π0"

    def update(self, done: int, total: int) -> None:
        self._report(done, total, info="groups")


def print_sampler_mismatch(mismatch: "SamplerMismatch") -> None:
    """The pool's sampler against the learner before any update, each measure beside the field's name."""
    m = mismatch
    table = Table(
        title=f"sampler against the learner before any update ({m.responses} responses, {m.tokens} tokens)"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("the field's name")
    for label, value, field_name in (
        ("mean |Δ log π|", f"{m.abs_log_ratio:.3g}", "vime #64"),
        ("K3, token mean", f"{m.k3:.3g}", "NeMo-RL gen_kl_error"),
        ("mean |π − μ|", f"{m.probs_diff:.3g}", "verl rollout_probs_diff_mean"),
        ("mean exp|Δ log π|", f"{m.mult_prob_error:.6g}", "NeMo-RL token_mult_prob_error"),
        ("sequence ESS", f"{m.ess:.4f}", ""),
        ("token ratio p05 / p50 / p95", f"{m.ratio_p05:.4f} / {m.ratio_p50:.4f} / {m.ratio_p95:.4f}", ""),
        ("token ratios outside [0.5, 2]", f"{m.outside:.2%}", ""),
    ):
        table.add_row(label, value, field_name)
    stdout.print(table)


class ImportProgress(_LazyProgress):
    """Records read, then groups written."""

    label = "importing"

    def update(self, stage: str, done: int, total: int | None) -> None:
        self._report(done, total, stage=stage)


class TrainingProgress(_LazyProgress):
    """Updates done with loss, reward and drift."""

    label = "training"

    def __init__(self, updates: int):
        self.updates = updates

    def update(self, update: int, metrics: dict) -> None:
        info = (
            f"updates  loss {metrics['loss']:+.4f}  reward {metrics['train/reward']:.3f}  "
            f"drift {metrics['mismatch/drift']:.4f}"
        )
        self._report(update + 1, self.updates, info=info)

    def evaluated(self, update: int, report: "EvalReport") -> None:
        """One line per evaluation, above the bar (stderr, like the bar)."""
        console.print(f"eval at update {update}: {eval_line(report)}")


def eval_line(report: "EvalReport") -> str:
    """``arith-test mean@8 31.2%  pass@8 70.0%`` for every benchmark (and the suite when several)."""
    top_k = report.ks[-1] if report.ks else None
    scopes = dict(report.benchmarks)
    if len(scopes) > 1:
        scopes["suite"] = report.suite
    parts = []
    for name, scores in scopes.items():
        part = f"{name} mean@{report.n} {100 * scores.mean_at_n:.1f}%"
        if top_k is not None and top_k > 1:
            part += f"  pass@{top_k} {100 * scores.pass_at_k[top_k]:.1f}%"
        parts.append(part)
    return "   ".join(parts)


def print_training_result(result) -> None:
    stdout.print(f"final model: {result.final_model}")
    from ggpo_offline.train.run_folder import RunFolder

    stdout.print(f"metrics: {RunFolder(result.run_dir).metrics_file}; MLflow run: {result.run_id}")
    stdout.print(f"data-order fingerprint: {result.fingerprints.data_order_fingerprint}")


class EvalProgress(_LazyProgress):
    """Problems done, responses/s and the fraction correct so far."""

    label = "evaluating"

    def update(self, progress) -> None:
        rate = progress.responses / max(progress.elapsed_s, 1e-9)
        self._report(
            progress.problems_done,
            progress.problems_total,
            rate=f"problems  {rate:.0f} responses/s",
            correct=f"correct {progress.mean_reward:.3f}",
        )


def print_eval_report(report: "EvalReport", out=None) -> None:
    """The `eval` table: one row per benchmark and the problem-weighted suite, scores in percent."""
    s = report.settings.sampling
    title = (
        f"{report.settings.model.name}: n={report.n}, temperature={s.temperature}, top_p={s.top_p}, "
        f"top_k={s.top_k}, max_tokens={s.max_tokens}, seed={s.seed}"
    )
    table = Table(title=title)
    table.add_column("benchmark")
    table.add_column("problems", justify="right")
    for metric in [f"mean@{report.n}"] + [f"pass@{k}" for k in report.ks]:
        table.add_column(metric + " %", justify="right")
    rows = list(report.benchmarks.items())
    for index, (name, scores) in enumerate([*rows, ("suite", report.suite)]):
        values = [scores.mean_at_n, *(scores.pass_at_k[k] for k in report.ks)]
        table.add_row(
            name,
            f"{scores.num_problems:,}",
            *[f"{100 * value:.2f}" for value in values],
            end_section=index == len(rows) - 1,
        )
    stdout.print(table)
    if report.generated is not None:
        stdout.print(generated_line(report.generated))
    if out is not None:
        stdout.print(f"report: {out}")


def generated_line(generated: dict) -> str:
    """What the model wrote (`ggpo_offline.evaluate.generated`), in one line."""
    line = (
        f"generated: {generated['mean_length']:.1f} tokens per response, {100 * generated['stop_rate']:.1f}% "
        f"ended at EOS, NLL {generated['nll']:.3f} nats per token"
    )
    if generated["novel_first_token"] is None:
        return line + "; novelty against the pool: give --pool"
    return (
        f"{line}; against the pool: {100 * generated['novel_first_token']:.1f}% novel first tokens, "
        f"{100 * generated['novel_bigram']:.2f}% novel bigrams"
    )


class JobProgress:
    """A line per job when its state changes (queued, running, done, failed), and while it runs, how far it
    has come at most every PROGRESS_S seconds."""

    PROGRESS_S = 30.0

    def __init__(self):
        self._seen: dict[str, tuple[str, float]] = {}

    def __call__(self, name: str, state) -> None:
        import time

        last = self._seen.get(name)
        now = time.monotonic()
        if last is not None and last[0] == state.status:
            if state.status != "running" or now - last[1] < self.PROGRESS_S:
                return
        self._seen[name] = (state.status, now)
        console.print(f"{name}: {state.text()}")


def print_allocations(config, allocations: list) -> None:
    """What a compare's --budget bought, and the next best choices it weighed."""
    if not allocations:
        return
    chosen, *others = allocations
    seeds = ",".join(map(str, config.seeds))
    stdout.print(f"budget: {chosen.text()} (seeds {seeds})")
    for other in others[:3]:
        stdout.print(f"  instead of {other.text()}")


DRY_RUN = "dry run: nothing was written; the same command without --dry-run runs this plan"


def print_run_plan(plan) -> None:
    """`ggpo train --dry-run`: what the run would do, after the resolved config."""
    from ggpo_offline.train.dry_run import plan_lines

    verb = {"train": "train", "resume": "resume", "replace": "replace the run in"}[plan.action]
    stdout.print(f"run: {verb} {plan.config.run_dir}")
    for line in plan_lines(plan):
        stdout.print(line)
    stdout.print(f"time: {plan.estimate().text()}")
    stdout.print(DRY_RUN)


def print_compare_plan(ready) -> None:
    """`ggpo compare --dry-run`: the runs, what happens to each, their data and evaluations, where the jobs
    run and the command of each, the time."""
    from ggpo_offline.compare.comparison import ACTIONS
    from ggpo_offline.jobs.job import shell_command
    from ggpo_offline.train.dry_run import RunPlan, plan_lines

    runs, config = ready.runs, ready.config
    stdout.print(
        f"plan: {len(config.methods)} method(s) x {len(config.seeds)} seed(s) = {len(runs)} runs into"
        f" {config.report_dir}"
    )
    for line in plan_lines(RunPlan(runs[0].config, runs[0].action, ready.inputs)):
        stdout.print(line)
    for action in ACTIONS:
        names = [run.config.run_name for run in runs if run.action == action]
        if names:
            stdout.print(f"{ACTIONS[action].doing} {len(names)}: {', '.join(names)}")
    jobs = ready.jobs()
    for line in ready.launcher.describe():
        stdout.print(line)
    stdout.print(f"jobs: {len(jobs)}, one per run to train, each running:")
    for job in jobs:
        stdout.print(f"  {shell_command(job)}")
    stdout.print(f"time: {ready.estimate().text()}")
    stdout.print(DRY_RUN)


def print_compare_result(result) -> None:
    from ggpo_offline.compare.comparison import Submitted

    if isinstance(result, Submitted):
        stdout.print(
            f"submitted {result.jobs} job(s); the same command follows them and then writes the report:"
        )
        stdout.print(f"  {result.command}", soft_wrap=True)
        return
    for seed, fingerprint in result.data_plans.items():
        runs = sum(record.seed == seed for record in result.records)
        stdout.print(f"seed {seed}: data-order fingerprint {fingerprint} shared by all {runs} runs")
    stdout.print(result.report.table_md)
    stdout.print(
        f"report: {result.report_dir}/README.md (table.md, table.csv, counts.json, figure.png and one PNG "
        "per panel)"
    )
    if result.parent_run_id is not None:
        stdout.print(f"MLflow parent run: {result.parent_run_id}")


def print_style_report(report: dict) -> None:
    """The `measure-styles` tables: each style's share and accuracy (free sampling) and its forced accuracy,
    overall and per prompt class, the forced responses' lengths, and the two ceilings of selection."""
    problems = f"{report['n_problems']} arith {report['split']} problems"
    table = Table(title=f"{report['model']}: {problems}, n={report['m']}")
    table.add_column("class")
    table.add_column("style")
    table.add_column("share %", justify="right")
    table.add_column("accuracy %", justify="right")
    table.add_column("forced accuracy %", justify="right")
    table.add_column("forced length median / p90 / max", justify="right")
    parts = {"all": (report["styles"], report["accuracy"], report["forced"])}
    for name, scores in report["by_class"].items():
        forced = {style: accuracies[name] for style, accuracies in report["forced_by_class"].items()}
        parts[f"{name} ({scores['problems']})"] = (
            {style: scores[style] for style in report["styles"]},
            scores["accuracy"],
            forced,
        )
    for part, (styles, accuracy, forced) in parts.items():
        class_name = part.split(" ")[0]
        for name, scores in styles.items():
            lengths = report["lengths"].get(name, {}).get(class_name)
            table.add_row(
                part,
                name,
                f"{100 * scores['share']:.1f}",
                _percent(scores["accuracy"]),
                _percent(forced.get(name)),
                "-" if lengths is None else f"{lengths['median']} / {lengths['p90']} / {lengths['max']}",
            )
        table.add_row(part, "all", "100.0", _percent(accuracy), "", "", end_section=True)
    stdout.print(table)
    m = report["m"]
    line = f"mean@{m} {100 * report['accuracy']:.2f} %, pass@{m} {100 * report['pass_at_m']:.2f} %"
    if report["forced"]:
        blind, aware = report["prompt_blind_ceiling"], report["prompt_aware_ceiling"]
        styles = ", ".join(f"{style} on {name}" for name, style in aware["styles"].items())
        line += (
            f"; prompt-blind ceiling {100 * blind['accuracy']:.2f} % ({blind['style']} everywhere)"
            f", prompt-aware ceiling {100 * aware['accuracy']:.2f} % ({styles})"
        )
    stdout.print(line)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"
