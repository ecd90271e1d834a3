"""Every TrainConfig field is a flag of `ggpo train` and a key of --config, with one help text, and `ggpo
compare` offers the same flags for its shared settings."""

import json
import sys
import typing
from dataclasses import fields
from pathlib import Path

import pytest
import typer

from ggpo_offline.train.config import PER_RUN, TrainConfig, flag_name, resolve_config

HINTS = typing.get_type_hints(TrainConfig)


def chosen_value(name: str):
    """A value of the field's type that differs from its default and passes validation."""
    special = {
        "method": "grpo-tis", "eval_engine": "hf", "pool": Path("elsewhere/p.parquet"), "out": Path("run/x"),
        "ref_refresh": 7, "eval_gpu_memory_fraction": 0.6, "eval_datasets": ("a.jsonl", "arith:train"),
        "eval_ks": (1, 2), "model": "some/model", "tracking_uri": "sqlite:///x.db", "experiment": "exp",
        "cispo_low": 0.5,
    }  # fmt: skip
    if name in special:
        return special[name]
    default, kind = TrainConfig.__dataclass_fields__[name].default, HINTS[name]
    if kind is bool:
        return True
    if kind is float:
        return default * 2
    return 3 if default is None else default + 3  # int or int | None


def flags_for(values: dict) -> list[str]:
    words = []
    for name, value in values.items():
        flag = "--" + flag_name(name)
        if value is True:
            words.append(flag)
        elif name == "eval_datasets":
            words += [part for item in value for part in (flag, item)]
        elif isinstance(value, tuple):
            words += [flag, ",".join(map(str, value))]
        else:
            words += [flag, str(value)]
    return words


def toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(map(toml, value)) + "]"
    return json.dumps(str(value))


def test_every_field_is_a_flag_and_a_config_file_key(tmp_path, monkeypatch, capsys):
    from ggpo_cli.main import main

    from ggpo_offline.train import trainer

    values = {f.name: chosen_value(f.name) for f in fields(TrainConfig)}
    assert all(values[name] != getattr(TrainConfig(), name) for name in values)
    expected = TrainConfig(**values)

    received = []
    monkeypatch.setattr(trainer, "train", lambda config, **_: received.append(config) or sys.exit(0))
    monkeypatch.setattr(sys, "argv", ["ggpo", "train", *flags_for(values)])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0, capsys.readouterr().err
    assert received == [expected]

    (tmp_path / "all.toml").write_text("".join(f"{name} = {toml(value)}\n" for name, value in values.items()))
    assert resolve_config(None, tmp_path / "all.toml") == expected


def _options(command: str) -> dict[str, str]:
    from ggpo_cli.main import app

    click_command = typer.main.get_command(app).commands[command]
    return {param.opts[0]: param.help for param in click_command.params}


def test_compare_offers_the_same_flags_as_train_for_every_shared_setting():
    train, compare = _options("train"), _options("compare")
    shared = ["--" + flag_name(f.name) for f in fields(TrainConfig) if f.name not in PER_RUN]
    assert all(train[flag] == compare[flag] for flag in shared)
    assert "--method" in train and "--seed" in train and "--seed" not in compare
