"""Configs refuse a bad value where they are built, with the line the CLI prints; the in-training evaluation's
settings, nested in TrainConfig, keep their flags, config-file keys and config.json order."""

from dataclasses import replace
from pathlib import Path

import pytest
from test_cli import assert_one_error_line, ggpo_here

from ggpo_offline.compare.config import ArcConfig, CompareConfig
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import construct, leaves, replace_settings, to_flags
from ggpo_offline.evaluate.config import EvalConfig, TrainingEvalConfig
from ggpo_offline.train.config import TrainConfig, TrainOptions
from ggpo_offline.train.training_presets import resolve_config

TRAIN_SETTINGS = [
    "pool", "method", "model", "seed", "updates", "groups_per_batch", "lr", "beta", "clip", "push_bound",
    "ref_refresh", "horizon", "cost_bound", "cispo_low", "cispo_high", "tis_block", "tis_cap", "clip_eps",
    "dual_clip", "kl_coef", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "grad_clip",
    "micro_batch_size", "forward_tokens", "no_packing", "fsdp", "sync_every", "off_policy_steps", "lag",
    "sync_dataset", "behavior_logprobs", "log_every", "ess_block", "probe_groups", "save_every", "out",
    "threads", "tracking_uri", "experiment", "no_tracking", "allow_tokenizer_mismatch",
    "allow_truncated_sampling", "eval_every", "eval_datasets", "test_datasets", "test_num_problems",
    "no_test", "allow_test_eval", "eval_n", "eval_ks", "eval_num_problems", "eval_engine", "eval_seed",
    "eval_gpu_memory_fraction",
]  # fmt: skip
"""Every training setting in the order of its flags, its config-file keys and config.json (before the
evaluation's settings were nested)."""
HELD_OUT = (
    "--eval-dataset arith:test: the in-training evaluation selects the reported checkpoint, so it must not "
    "see the test split; use arith:validation (test is evaluated once at the end, --test-dataset) or pass "
    "--allow-test-eval"
)


def _refused(build, *args, **kwargs) -> str:
    with pytest.raises(UserError) as refused:
        build(*args, **kwargs)
    return str(refused.value)


def test_train_config_refuses_a_bad_value_at_construction():
    assert _refused(TrainConfig, lr=-1.0) == "--lr must be > 0, got -1.0"
    assert _refused(TrainConfig, lr=-1.0, updates=0) == "--updates must be >= 1, got 0"  # the order kept
    assert _refused(TrainConfig, method="nope", updates=0).startswith("unknown method 'nope'")
    assert _refused(TrainConfig, method="grpo-tis", tis_block=0) == "--tis-block must be >= 1, got 0"
    assert _refused(TrainConfig, method="ggpo", beta=0.0) == "--beta must be > 0 for ggpo, got 0.0"
    assert (
        _refused(TrainConfig, method="pg", ref_refresh=5) == "--ref-refresh: pg has no reference to refresh"
    )
    assert _refused(TrainConfig, updates=4, sync_every=1, off_policy_steps=4).startswith(
        "--off-policy-steps must be in 0..3 (--updates - 1), got 4"
    )


def test_a_setting_the_learner_does_not_read_is_not_range_checked():
    assert TrainConfig(method="ggpo", tis_block=0).tis_block == 0  # GGPO has no π_old block
    assert TrainConfig(method="grpo", cost_bound=-1.0).cost_bound == -1.0


def test_the_evaluation_refuses_its_own_bad_values_and_the_test_split():
    assert _refused(TrainingEvalConfig, eval_n=0) == "--eval-n must be >= 1, got 0"
    assert _refused(TrainingEvalConfig, eval_ks=(1, 0)) == "--eval-k values must be >= 1, got 0"
    assert _refused(TrainingEvalConfig, eval_gpu_memory_fraction=1.0) == (
        "--eval-gpu-memory-fraction must be in (0, 1), got 1.0"
    )
    assert (
        _refused(TrainingEvalConfig, eval_engine="tgi")
        == "unknown --eval-engine 'tgi'; choose one of vllm, hf"
    )
    assert _refused(TrainingEvalConfig, eval_datasets=("arith:test",)) == HELD_OUT
    assert _refused(construct, TrainConfig, {"eval_datasets": ("arith:test",)}) == HELD_OUT
    assert _refused(TrainingEvalConfig, test_datasets=("a", "a")) == "a --test-dataset is given twice"
    allowed = TrainingEvalConfig(eval_datasets=("arith:test",), allow_test_eval=True)
    assert allowed.eval_datasets == ("arith:test",)


def test_the_evaluation_protocol_is_ggpo_evals():
    evaluation = TrainingEvalConfig(eval_n=4, eval_ks=(1, 2), eval_num_problems=12, test_num_problems=30)
    assert evaluation.protocol("m", "p.parquet") == EvalConfig(
        model="m", datasets=("arith:validation",), n=4, ks=(1, 2), num_problems=12, pool=Path("p.parquet"),
        seed=0, engine="vllm", gpu_memory_fraction=0.3,
    )  # fmt: skip
    assert evaluation.protocol("m", "p.parquet", test=True).num_problems == 30
    assert evaluation.protocol("m", "p.parquet", test=True).datasets == ("arith:test",)
    assert replace(evaluation, test_num_problems=None).protocol("m", "p", test=True).num_problems == 12


def test_the_evaluation_settings_keep_their_names_keys_and_order():
    assert list(leaves(TrainConfig)) == TRAIN_SETTINGS
    assert list(TrainConfig().to_dict()) == TRAIN_SETTINGS
    config = resolve_config("tiny", None, method="grpo", eval_n=4, eval_datasets=("a.jsonl", "b.jsonl"))
    assert config.evaluation.eval_n == 4 and config.to_dict()["eval_datasets"] == ["a.jsonl", "b.jsonl"]
    assert to_flags(config, TrainConfig)[-12:] == [
        "--eval-every", "10", "--eval-dataset", "a.jsonl", "--eval-dataset", "b.jsonl",
        "--test-num-problems", "128", "--eval-n", "4", "--eval-num-problems", "128",
    ]  # fmt: skip


def test_replace_settings_reaches_nested_settings_and_checks_again():
    config = TrainConfig(updates=7)
    changed = replace_settings(config, eval_every=3, lr=2e-6)
    assert (changed.evaluation.eval_every, changed.lr, changed.updates) == (3, 2e-6, 7)
    assert _refused(replace_settings, config, eval_n=0) == "--eval-n must be >= 1, got 0"
    with pytest.raises(TypeError, match="TrainConfig has no setting 'eval_m'"):
        replace_settings(config, eval_m=3)


def test_to_flags_writes_a_config_whose_settings_are_valid_only_together():
    config = resolve_config(
        None, None, method="cispo", cispo_low=2.0, cispo_high=3.0, eval_datasets=("arith:test",),
        allow_test_eval=True,
    )  # fmt: skip
    flags = to_flags(config, TrainConfig)
    assert flags == [
        "--method", "cispo", "--cispo-low", "2.0", "--cispo-high", "3.0", "--eval-dataset", "arith:test",
        "--allow-test-eval",
    ]  # fmt: skip


def test_train_options_refuse_a_bad_value_at_construction():
    assert _refused(TrainOptions, nproc=0) == "--nproc must be >= 1, got 0"
    assert _refused(TrainOptions, collective_timeout=0.0) == "--collective-timeout must be > 0, got 0.0"
    assert _refused(TrainOptions, wait_timeout=-1.0) == "--wait-timeout must be > 0, got -1.0"


def test_an_impossible_compare_is_refused_at_construction(tmp_path):
    assert _refused(CompareConfig, methods=()) == "give at least one method and one seed"
    assert _refused(CompareConfig, seeds=()) == "give at least one method and one seed"
    assert _refused(CompareConfig, methods=("grpo", "grpo")) == "a method is listed twice"
    assert _refused(CompareConfig, seeds=(1, 1)) == "a seed is listed twice"
    assert _refused(CompareConfig, methods=("grpo", "ppo")).startswith("unknown method 'ppo'")
    assert _refused(CompareConfig, settings={"out": "x", "seed": 3}) == (
        "compare chooses seed, out for each run; remove it from the settings"
    )
    assert _refused(CompareConfig, budget=20.0) == (
        "--budget needs --budget-from, a compare report whose variance and times it projects"
    )
    assert (
        _refused(CompareConfig, budget_from=tmp_path)
        == "--budget-from needs --budget (core-minutes to spend)"
    )
    assert _refused(CompareConfig, budget=0.0, budget_from=tmp_path) == "--budget must be > 0, got 0.0"
    assert _refused(ArcConfig, methods=("grpo",), parts=("p",), seeds=(1,)) == (
        "--styles-seed 42 is not one of --seeds 1"
    )


def test_the_command_line_prints_the_constructors_line(tmp_path):
    assert_one_error_line(
        ggpo_here("train", "--lr", "-1", "--dry-run", cwd=tmp_path), "--lr must be > 0, got -1.0"
    )
    assert_one_error_line(
        ggpo_here("train", "--nproc", "0", "--dry-run", cwd=tmp_path), "--nproc must be >= 1, got 0"
    )
    refused = ggpo_here("compare", "--seeds", "1,1", "--dry-run", cwd=tmp_path)
    assert_one_error_line(refused, "a seed is listed twice")


def _settings_classes() -> list[type]:
    """Every settings dataclass of the package: a dataclass with a field made by `setting`."""
    import dataclasses
    import importlib
    import pkgutil

    import ggpo_offline

    found = {}
    for module in pkgutil.walk_packages(ggpo_offline.__path__, "ggpo_offline."):
        for value in vars(importlib.import_module(module.name)).values():
            ours = isinstance(value, type) and value.__module__ == module.name
            if ours and dataclasses.is_dataclass(value):
                if any("help" in field.metadata for field in dataclasses.fields(value)):
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


SETTINGS_CLASSES = _settings_classes()
MEANINGFUL = {"methods": ("grpo",), "format": "generic"}
"""Required settings whose value must name something real (a learner, an import format)."""


def _required(cls: type) -> dict:
    """A value for each required setting of ``cls``: one that builds."""
    import dataclasses
    import typing

    from ggpo_offline.core.settings import choices, type_of

    values = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            continue
        hint = type_of(cls, field.name)
        if field.name in MEANINGFUL:
            values[field.name] = MEANINGFUL[field.name]
        elif choices(cls, field.name):
            values[field.name] = choices(cls, field.name)[0]
        elif typing.get_origin(hint) is tuple:
            values[field.name] = ("x",)
        else:
            values[field.name] = Path("x") if hint is Path else "x"
    return values


def _reader(cls: type, name: str) -> dict:
    """For a learner's setting of TrainConfig, a method that reads it (one that does not leaves it unused)."""
    from ggpo_offline.train.learners import LEARNERS, SETTINGS

    if cls is not TrainConfig or name not in SETTINGS:
        return {}
    return {"method": next(method for method, entry in LEARNERS.items() if entry.reads(name))}


def _own_settings(cls: type) -> list[str]:
    return [name for name, (owner, _) in leaves(cls).items() if owner is cls]


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda cls: cls.__name__)
def test_every_setting_is_refused_just_outside_its_declared_range_where_it_is_built(cls):
    """Walks each settings dataclass: it builds from its defaults; each number setting declares a range
    (a new one without one fails here) and is refused, naming its flag, just outside each end, and as a
    number of the wrong kind; each setting with choices refuses a value that is none of them."""
    from ggpo_offline.core.settings import choices, element_type, flag_name, number_kind, valid_range

    required = _required(cls)
    cls(**required)
    for name in _own_settings(cls):
        flag, kind = flag_name(cls, name), number_kind(cls, name)
        wrapped = (lambda value: (value,)) if element_type(cls, name) else (lambda value: value)
        given = {**required, **_reader(cls, name)}
        if choices(cls, name):
            assert _refused(cls, **{**given, name: wrapped("nope")}).startswith(f"unknown --{flag} 'nope'")
        if kind is None:
            continue
        valid = valid_range(cls, name)
        assert valid is not None, f"{cls.__name__}.{name} is a number setting without a declared range"
        for value in valid.outside(whole=kind is int):
            refused = _refused(cls, **{**given, name: wrapped(value)})
            assert refused.startswith(f"--{flag}") and f"got {value}" in refused, (name, value, refused)
        wrong_kind = 1.5 if kind is int else "1"
        assert f"must be {'a ' if not element_type(cls, name) else ''}" in _refused(
            cls, **{**given, name: wrapped(wrong_kind)}
        )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"method": "grpo", "dual_clip": 0.5}, "--dual-clip must be > 1, got 0.5"),
        ({"method": "grpo", "clip_eps": -1.0}, "--clip-eps must be in (0, 1), got -1.0"),
        ({"method": "grpo", "kl_coef": -1.0}, "--kl-coef must be >= 0, got -1.0"),
        ({"method": "ggpo-clip", "clip": -1.0}, "--clip must be > 0, got -1.0"),
        ({"method": "grpo-tis", "tis_cap": -1.0}, "--tis-cap must be > 0, got -1.0"),
        ({"grad_clip": -1.0}, "--grad-clip must be > 0, got -1.0"),
        ({"weight_decay": -5.0}, "--weight-decay must be >= 0, got -5.0"),
        ({"adam_beta1": 2.0}, "--adam-beta1 must be in [0, 1), got 2.0"),
        ({"adam_eps": -1.0}, "--adam-eps must be > 0, got -1.0"),
        ({"seed": 1.5}, "--seed must be a whole number, got 1.5"),
        ({"ref_refresh": 0}, "--ref-refresh must be >= 1 or 'never', got 0"),
    ],
)
def test_the_values_a_train_config_once_accepted_are_refused_in_one_line(changes, message):
    assert _refused(TrainConfig, **changes) == message


def test_compare_arc_options_and_corrections_refuse_at_construction():
    from typing import get_args

    from ggpo_offline.train.config import Preset
    from ggpo_offline.train.correction_presets import Correction
    from ggpo_offline.train.training_presets import PRESETS

    assert _refused(CompareConfig, settings={"lr": -1.0}) == "--lr must be > 0, got -1.0"
    assert _refused(CompareConfig, settings={"bogus": 1}) == "the training settings: unknown setting 'bogus'"
    assert _refused(CompareConfig, seeds=(1, -2)) == "--seeds values must be >= 0, got -2"
    assert _refused(ArcConfig, methods=("grpo", "grpo"), parts=("a",)) == "a method is listed twice"
    assert _refused(ArcConfig, methods=("nope",), parts=("a",)).startswith("unknown method 'nope'")
    assert _refused(TrainOptions, preset="nope").startswith("unknown --preset 'nope'; choose one of")
    assert tuple(PRESETS) == get_args(Preset)
    with pytest.raises(ValueError, match="objective is one of ppo, "):
        Correction(objective="nope")
    with pytest.raises(ValueError, match="rejection statistic is one of k1, k2, k3, got 'k9'"):
        Correction(rejections=(("token_k9", 2.0),))
