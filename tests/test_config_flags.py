"""Every command's options come from its settings dataclass: each field is a flag with its help, a config-file
key where the command reads one, and `to_flags` writes the flags that give a config back."""

import ast
import json
import re
import sys
import typing
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer

from ggpo_offline.compare.config import (
    ArcConfig,
    CompareConfig,
    LadderConfig,
    RefreshConfig,
    RegimesConfig,
    TuneConfig,
)
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import (
    choices,
    config_from,
    construct,
    element_type,
    field_of,
    flag_name,
    leaf_values,
    leaves,
    normalize,
    to_flags,
    type_of,
)
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.generate.config import GenerateConfig
from ggpo_offline.generate.datasets import DatasetColumns
from ggpo_offline.generate.engines import SamplingSettings
from ggpo_offline.importing.config import ImportConfig
from ggpo_offline.jobs.config import LaunchConfig
from ggpo_offline.organism.config import RehearsalModelConfig, StylesConfig, TinyModelConfig
from ggpo_offline.pool.config import MergeConfig
from ggpo_offline.train.config import PER_RUN, ScoreConfig, TrainConfig, TrainOptions
from ggpo_offline.train.training_presets import resolve_config

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "generate-pool": [(GenerateConfig, ())],
    "train": [(TrainOptions, ()), (TrainConfig, ())],
    "eval": [(EvalConfig, ())],
    "compare": [(CompareConfig, ("settings",)), (TrainConfig, PER_RUN)],
    "arc-report": [(ArcConfig, ())],
    "ladder-report": [(LadderConfig, ())],
    "regimes-report": [(RegimesConfig, ())],
    "tune-report": [(TuneConfig, ())],
    "report": [(RefreshConfig, ())],
    "build-tiny-model": [(TinyModelConfig, ())],
    "build-rehearsal-model": [(RehearsalModelConfig, ())],
    "measure-styles": [(StylesConfig, ())],
    "pool score": [(ScoreConfig, ())],
    "pool merge": [(MergeConfig, ())],
    "pool import": [(ImportConfig, ())],
}
"""Each command's settings dataclasses and the fields that are not its flags."""
NOT_READ_BY_GRPO_TIS = ("beta", "clip", "horizon", "cost_bound", "cispo_low", "cispo_high", "push_bound")
"""Learner settings grpo-tis refuses (the registry's rule); the train round trip leaves them at default."""
SPECIAL = {
    "pool": Path("elsewhere/p.parquet"), "out": Path("run/x"), "method": "grpo-tis", "ref_refresh": 7,
    "eval_gpu_memory_fraction": 0.6, "gpu_memory_fraction": 0.6, "eval_datasets": ("a.jsonl", "arith:train"),
    "datasets": ("a.jsonl", "arith:train"), "methods": ("grpo", "ggpo"), "seeds": (3, 5), "top_p": 0.5,
    "shard_index": 1, "num_shards": 3, "preset": "tiny", "sbatch": ("constraint=a100", "exclusive="),
    "sync_every": 1, "off_policy_steps": 1, "adam_beta1": 0.8, "adam_beta2": 0.99, "clip_eps": 0.3,
}  # fmt: skip


def chosen_value(cls: type, name: str):
    """A value of the setting's type that differs from its default (and passes validation)."""
    if name in SPECIAL:
        return SPECIAL[name]
    default, kind = field_of(cls, name).default, type_of(cls, name)
    options = [choice for choice in choices(cls, name) if choice != default]
    if options:
        return options[0]
    if element_type(cls, name) is not None:
        return (1, 2) if element_type(cls, name) is int else ("one", "two")
    if kind is bool:
        return not default
    if Path in typing.get_args(kind) or kind is Path:
        return Path("some/where")
    if str in typing.get_args(kind) or kind is str:
        return "some-text"
    if float in typing.get_args(kind) or kind is float:
        return 0.5 if not default else default * 2
    return 3 if default is None else default + 3  # int or int | None


def changed_values(cls: type, skip: tuple[str, ...] = ()) -> dict:
    return {name: chosen_value(cls, name) for name in leaves(cls) if name not in skip}


def toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(map(toml, value)) + "]"
    return json.dumps(str(value))


def run_cli(monkeypatch, capsys, module, function: str, argv: list[str]) -> list:
    """Run ``ggpo argv`` with ``module.function`` replaced by one that records its first argument."""
    from ggpo_cli.main import main

    received = []
    monkeypatch.setattr(module, function, lambda config, *_, **__: received.append(config) or sys.exit(0))
    monkeypatch.setattr(sys, "argv", ["ggpo", *argv])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0, capsys.readouterr().err
    return received


def test_every_train_field_is_a_flag_and_a_config_file_key(tmp_path, monkeypatch, capsys):
    from ggpo_offline.train import dry_run, trainer

    values = changed_values(TrainConfig, NOT_READ_BY_GRPO_TIS)
    assert all(values[name] != leaf_values(TrainConfig())[name] for name in values)
    # --lag mixed refuses --behavior-logprobs learner (its rounds have one sampler per age): set apart.
    expected = construct(TrainConfig, values | {"lag": "fixed"})
    flags = to_flags(expected, TrainConfig)
    assert len([w for w in flags if w.startswith("--")]) == len(values) + 1  # 2 eval, 2 test sets, no --lag
    no_pool = SimpleNamespace(action="train", inputs=SimpleNamespace(pool=None))  # its checks need no pool
    monkeypatch.setattr(dry_run, "plan_run", lambda config, **how: no_pool)
    assert run_cli(monkeypatch, capsys, trainer, "train", ["train", *flags]) == [expected]
    mixed = construct(TrainConfig, values | {"behavior_logprobs": "engine"})
    assert run_cli(monkeypatch, capsys, trainer, "train", ["train", *to_flags(mixed, TrainConfig)]) == [mixed]
    values["lag"] = "fixed"  # the config file below: as the flags were

    (tmp_path / "all.toml").write_text("".join(f"{name} = {toml(value)}\n" for name, value in values.items()))
    assert resolve_config(None, tmp_path / "all.toml") == expected


@pytest.mark.parametrize("method", ["ggpo", "grpo", "pg"])
def test_to_flags_leaves_out_a_default_that_follows_the_method(method):
    config = TrainConfig(method=method)  # ref_refresh: 160 for ggpo, never for grpo and pg
    assert to_flags(config, TrainConfig) == ([] if method == "ggpo" else ["--method", method])
    assert to_flags(replace(config, ref_refresh=None), TrainConfig)[-2:] == (
        ["--ref-refresh", "never"] if method == "ggpo" else ["--method", method]
    )


def test_generate_config_round_trips_through_its_flags(monkeypatch, capsys):
    from ggpo_offline.generate import pipeline, shard_jobs

    # --keep-groups needs one shard and the parallel sizes the vllm engine: their own round trip below.
    apart = ("keep_groups", "tensor_parallel_size", "data_parallel_size")
    values = changed_values(GenerateConfig, skip=(*leaves(LaunchConfig), *apart))
    sampling = SamplingSettings(**{f.name: values.pop(f.name) for f in fields(SamplingSettings)})
    columns = DatasetColumns(**{f.name: values.pop(f.name) for f in fields(DatasetColumns)})
    expected = GenerateConfig(**values, sampling=sampling, columns=columns)
    assert all(value != getattr(GenerateConfig(), name) for name, value in values.items())
    assert all(getattr(columns, f.name) != f.default for f in fields(DatasetColumns))
    assert all(getattr(sampling, f.name) != f.default for f in fields(SamplingSettings))
    flags = to_flags(expected, GenerateConfig)
    assert "--samples-per-prompt" in flags and "--template" in flags
    assert run_cli(monkeypatch, capsys, pipeline, "generate_pool", ["generate-pool", *flags]) == [expected]
    short = run_cli(monkeypatch, capsys, pipeline, "generate_pool", ["generate-pool", "-m", "4"])
    assert short == [GenerateConfig(sampling=SamplingSettings(m=4))]
    parallel = GenerateConfig(tensor_parallel_size=2, data_parallel_size=3)
    for config in (GenerateConfig(keep_groups=3), parallel):
        flags = to_flags(config, GenerateConfig)
        assert run_cli(monkeypatch, capsys, pipeline, "generate_pool", ["generate-pool", *flags]) == [config]
    # With --launcher slurm the shards are submitted as a job array (each task's --shard-index is its own).
    launch = {**changed_values(LaunchConfig), "sbatch": ("constraint=a100", "exclusive=")}
    on_slurm = construct(GenerateConfig, {**leaf_values(expected), **launch, "shard_index": 0})
    flags = to_flags(on_slurm, GenerateConfig)
    assert "--launcher" in flags and "--partition" in flags
    assert run_cli(monkeypatch, capsys, shard_jobs, "generate_on_slurm", ["generate-pool", *flags]) == [
        on_slurm
    ]


def test_eval_config_round_trips_through_its_flags(monkeypatch, capsys):
    from ggpo_offline.evaluate import evaluator

    values = changed_values(EvalConfig)
    columns = DatasetColumns(**{f.name: values.pop(f.name) for f in fields(DatasetColumns)})
    expected = EvalConfig(**values, columns=columns)
    assert all(leaf_values(expected)[k] != v for k, v in leaf_values(EvalConfig()).items())
    flags = to_flags(expected, EvalConfig)
    assert flags.count("--dataset") == 2 and "--num-samples" in flags and "--ks" in flags
    assert run_cli(monkeypatch, capsys, evaluator, "evaluate", ["eval", *flags]) == [expected]
    short = run_cli(monkeypatch, capsys, evaluator, "evaluate", ["eval", "-n", "4", "-k", "1,2"])
    assert short == [EvalConfig(n=4, ks=(1, 2))]


def test_compare_config_round_trips_through_its_flags(monkeypatch, capsys):
    from ggpo_offline.compare import comparison, run_sections

    settings = {
        "updates": 7,
        "eval_ks": (1, 2),
        "eval_datasets": ("arith:test", "b.jsonl"),
        "no_tracking": True,
    }
    # --budget resolves into seeds and sizes before compare runs (tests/test_budget.py) and --dry-run stops
    # before it (tests/test_dry_run.py); not set here
    # --jobs is local's: with every launch setting changed (--launcher slurm), it keeps its default
    planned = ("settings", "budget", "budget_from", "dry_run", "jobs")
    expected = construct(CompareConfig, {**changed_values(CompareConfig, planned), "settings": settings})
    listed = tuple(name for name in leaves(CompareConfig) if name not in (*planned, "out", "rerun"))
    flags = to_flags(expected, CompareConfig, only=listed) + to_flags(
        expected.settings, TrainConfig
    ) + to_flags(expected, CompareConfig, only=("out", "rerun"))  # fmt: skip
    assert flags[:6] == ["--pool", "elsewhere/p.parquet", "--methods", "grpo,ggpo", "--seeds", "3,5"]
    [received] = run_cli(monkeypatch, capsys, comparison, "compare", ["compare", *flags])
    # the CLI hands the training flags on as given ("1,2"); resolve_config converts them for every run
    assert replace(received, settings=normalize(TrainConfig, received.settings, "flags")) == expected
    reproduced = run_sections.reproduce_command(expected, launch=True).split()[2:]
    assert sorted(reproduced) == sorted(flags[:-1])  # --rerun: not a setting


def _help_of(path: str) -> tuple:
    """A command and its --help text, unwrapped (one line per option)."""
    from ggpo_cli.main import app

    command = typer.main.get_command(app)
    for word in path.split():
        command = command.commands[word]
    context = typer.Context(command, info_name=path, terminal_width=10_000, max_content_width=10_000)
    return command, command.get_help(context)


def _option_line(help_text: str, flag: str) -> str | None:
    """The --help entry of ``flag`` on one line: its first column lists the option's names (``-n,
    --num-samples``); click moves the help of a long name to the next line."""
    lines = help_text.splitlines() + [""]
    for position, line in enumerate(lines):
        if line.startswith("  -") and flag in re.split(r"[ ,/]+", line.strip().split("  ")[0]):
            follows = lines[position + 1]
            return line if follows.startswith("  -") else f"{line} {follows.strip()}"
    return None


def _options(command) -> set[str]:
    return {p.opts[0] for p in command.params if p.param_type_name == "option"} - {"--help"}


@pytest.mark.parametrize("path", list(COMMANDS))
def test_every_setting_of_every_command_is_a_flag_with_its_help(path):
    command, help_text = _help_of(path)
    expected = set()
    for cls, exclude in COMMANDS[path]:
        for name in leaves(cls):
            if name in exclude:
                continue
            flag = "--" + flag_name(cls, name)
            line = _option_line(help_text, flag)
            assert line is not None, f"{path}: no {flag}"
            assert field_of(cls, name).metadata["help"] in line, f"{path} {flag}: help differs"
            expected.add(flag)
    options = {max(p.opts, key=len) for p in command.params if p.param_type_name == "option"} - {"--help"}
    assert options == expected  # and no option that is not a setting


def test_every_command_is_walked():
    from ggpo_cli.main import app

    group = typer.main.get_command(app)
    with_options = set()
    for name, command in group.commands.items():
        subcommands = command.commands.items() if hasattr(command, "commands") else [(None, command)]
        for sub, leaf in subcommands:
            if _options(leaf):
                with_options.add(name if sub is None else f"{name} {sub}")
    assert with_options == set(COMMANDS)


def test_compare_offers_the_same_flags_as_train_for_every_shared_setting():
    _, train = _help_of("train")
    _, compare = _help_of("compare")
    shared = ["--" + flag_name(TrainConfig, name) for name in leaves(TrainConfig) if name not in PER_RUN]
    lines = {text: {line for line in text.splitlines() if line.strip().startswith("--")} for text in (train,)}
    assert all(line in compare.splitlines() for line in lines[train] if line.split()[0] in shared)
    assert "--method" in train and "--seed" in train and "\n  --seed " not in compare


@pytest.mark.parametrize(
    ("cls", "values", "message"),
    [
        (EvalConfig, {"dtype": "f8"}, "unknown --dtype 'f8'; choose one of auto, float32, bfloat16, float16"),
        (
            GenerateConfig,
            {"template": "chatty"},
            "unknown --template 'chatty'; choose one of auto, chat, plain",
        ),
        (TrainConfig, {"eval_engine": "tgi"}, "unknown --eval-engine 'tgi'; choose one of vllm, hf"),
    ],
)
def test_a_choice_outside_its_literal_is_refused_with_one_line(cls, values, message):
    with pytest.raises(UserError) as refused:
        config_from(cls, values)
    assert str(refused.value) == message
    with pytest.raises(UserError, match=message):
        construct(cls, values)  # the library's own constructors check it too (a nested one its own)


def test_a_choice_outside_its_literal_is_one_error_line_on_the_command_line(monkeypatch, capsys):
    from ggpo_cli.main import main

    monkeypatch.setattr(sys, "argv", ["ggpo", "eval", "--engine", "tgi"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 1
    assert capsys.readouterr().err == "error: unknown --engine 'tgi'; choose one of vllm, hf\n"


def test_list_flags_name_the_flag_when_an_item_is_not_a_number():
    with pytest.raises(UserError, match=r"^--ks must be comma-separated whole numbers, got '1,x'$"):
        config_from(EvalConfig, {"ks": "1,x"})


def restated_defaults(source: str) -> list[str]:
    """``typer.Option(8, ...)`` and literal parameter defaults: a setting's default restated in cli/."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("Option", "Argument"):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and first.value not in (None, Ellipsis):
                found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
        if isinstance(node, ast.FunctionDef) and any(
            "command" in ast.unparse(d) for d in node.decorator_list
        ):
            for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                if isinstance(default, ast.Constant) and default.value is not None:
                    found.append(f"line {default.lineno}: {node.name} default {default.value!r}")
    return found


def test_the_cli_restates_no_default():
    assert restated_defaults('import typer\ndef f(n: int = typer.Option(8, "-m")): ...')  # the check bites
    assert restated_defaults('@app.command("x")\ndef f(forced=True): ...')
    for path in sorted((REPO / "cli").glob("*.py")):
        assert restated_defaults(path.read_text()) == [], path.name
