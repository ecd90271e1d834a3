"""Terminal output of the CLI: the generation progress bar and the pool summary table."""

import json

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(stderr=True)


class GenerationProgress:
    """A progress bar over prompts, with responses/s and the mean reward so far.

    It appears with the first finished batch, so input errors found earlier print as one clean line.
    """

    def __enter__(self) -> "GenerationProgress":
        self._bar = None
        return self

    def _start(self) -> None:
        self._bar = Progress(
            TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TextColumn("prompts"),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[reward]}"), TimeElapsedColumn(),
            console=console,
        )
        self._bar.__enter__()
        self._task = self._bar.add_task("generate", total=None, rate="", reward="")

    def update(self, progress) -> None:
        if self._bar is None:
            self._start()
        rate = progress.responses / max(progress.elapsed_s, 1e-9)
        self._bar.update(
            self._task, completed=progress.prompts_done, total=progress.prompts_total,
            rate=f"{rate:.0f} responses/s", reward=f"reward {progress.mean_reward:.3f}",
        )

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def print_summary(summary: dict, with_metadata: bool = False) -> None:
    """The `pool inspect` table (and the metadata as indented JSON when asked)."""
    meta = summary["metadata"]
    table = Table(title=summary["path"], show_header=False)
    sampling = meta.get("sampling", {})
    rows = [
        ("model", meta.get("model", {}).get("name")),
        ("engine", f"{meta.get('engine', {}).get('name')} {meta.get('engine', {}).get('version')} ({meta.get('dtype')})"),
        ("dataset", meta.get("dataset", {}).get("spec")),
        ("sampling", ", ".join(f"{k}={sampling.get(k)}" for k in ("m", "temperature", "top_p", "top_k", "max_tokens", "seed"))),
        ("groups", f"{summary['groups']:,}"),
        ("responses", f"{summary['responses']:,}"),
        ("mean reward", f"{summary['mean_reward']:.4f}"),
        ("mixed groups", f"{summary['mixed_groups']:,} ({summary['mixed_frac']:.1%})"),
        ("all-wrong / all-right groups", f"{summary['all_wrong_groups']:,} / {summary['all_right_groups']:,}"),
        ("response tokens", f"{summary['tokens']:,} (mean length {summary['mean_length']:.1f})"),
        ("length p10 / p50 / p90 / p99 / max",
         f"{summary['p10']} / {summary['p50']} / {summary['p90']} / {summary['p99']} / {summary['max_length']}"),
        ("truncated (finish_reason=length)", f"{summary['truncated_frac']:.2%}"),
    ]
    if "generation_seconds" in meta:
        seconds = meta["generation_seconds"]
        rows.append(("generation time", f"{seconds:.0f} s ({summary['tokens'] / max(seconds, 1e-9):,.0f} tokens/s)"))
    for key, value in rows:
        table.add_row(key, str(value))
    Console().print(table)
    if with_metadata:
        Console().print_json(json.dumps(meta))


def print_config(config) -> None:
    """The resolved training configuration, printed at start."""
    table = Table(title="resolved config", show_header=False)
    for key, value in config.to_dict().items():
        table.add_row(key, str(value))
    table.add_row("run folder", str(config.run_dir))
    console.print(table)


class TrainingProgress:
    """A progress bar over updates with loss, reward and drift."""

    def __init__(self, updates: int):
        self.updates = updates

    def __enter__(self) -> "TrainingProgress":
        self._bar = Progress(
            TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=console,
        )
        self._bar.__enter__()
        self._task = self._bar.add_task("train", total=self.updates, info="")
        return self

    def update(self, update: int, metrics: dict) -> None:
        info = (f"loss {metrics['loss']:+.4f}  reward {metrics['train/reward']:.3f}  "
                f"drift {metrics['mismatch/drift']:.4f}")
        self._bar.update(self._task, completed=update + 1, info=info)

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)


def print_training_result(result) -> None:
    console.print(f"final model: {result.final_model}")
    console.print(f"metrics: {result.run_dir / 'metrics.jsonl'}; MLflow run: {result.run_id}")
    console.print(f"data-order fingerprint: {result.data_order_fingerprint}")
