"""The learner registry is the one source of learner facts: which settings each learner reads (others are
refused), their ranges, the help texts of their flags and the README's learner table."""

import re
import shlex
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path
from unittest import mock

import pytest
import typer
from conftest import REPO

from ggpo_offline.compare.comparison import run_configs
from ggpo_offline.compare.config import CompareConfig
from ggpo_offline.compare.run_sections import train_command
from ggpo_offline.core.errors import UserError
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.learner_table import (
    README_BEGIN,
    README_END,
    markdown_table,
    with_ablations_table,
    with_corrections_table,
    with_learner_table,
)
from ggpo_offline.train.learners import (
    CORRECTIONS,
    POSITIVE,
    REGISTRY,
    SETTINGS,
    learner,
)
from ggpo_offline.train.training_presets import resolve_config

VALID = {
    "beta": 0.5, "clip": 0.1, "ref_refresh": 7, "clip_eps": 0.3, "dual_clip": 5.0, "kl_coef": 0.02,
    "tis_cap": 3.0, "tis_block": 4, "horizon": 3, "cost_bound": 0.1, "cispo_low": 0.5, "cispo_high": 2.0,
    "push_bound": 5.0,
}  # fmt: skip
"""A valid value, other than the default, of every learner-specific setting."""


def expected_readers(setting: str) -> set[str]:
    """Who reads ``setting``, from the registry's raw facts: a loss keyword, or the schedule of a reference
    the loss takes (π_ref: T_ref; π_old: the TIS block)."""
    schedule = {"ref_refresh": "ref_logp", "tis_block": "old_logp"}
    return {
        entry.name
        for entry in REGISTRY + CORRECTIONS
        if setting in entry.hyperparameters or schedule.get(setting) in entry.needs
    }


def expected_names(setting: str) -> list[str]:
    """How a line names the readers of ``setting``: the toolkit's learners by name, the presets counted."""
    readers = expected_readers(setting)
    presets = sum(entry.name in readers for entry in CORRECTIONS)
    counted = [f"{presets} framework presets"] if presets else []
    return [entry.name for entry in REGISTRY if entry.name in readers] + counted


def test_the_learner_settings_are_every_hyperparameter_and_reference_schedule():
    hyperparameters = {name for entry in REGISTRY for name in entry.hyperparameters}
    assert set(SETTINGS) == hyperparameters | {"ref_refresh", "tis_block"}
    assert set(SETTINGS) <= {f.name for f in fields(TrainConfig)}
    assert set(VALID) == set(SETTINGS)
    for entry in REGISTRY:
        assert set(entry.bounds) <= set(entry.hyperparameters), entry.name
    # A learner only narrows its field's range (one place each): β > 0 where the loss divides by β.
    bounded = {name for entry in REGISTRY for name in entry.bounds}
    assert bounded == {"beta"}
    assert {str(bound) for entry in REGISTRY for bound in entry.bounds.values()} == {"> 0"}


BYPASS = next(entry for entry in CORRECTIONS if entry.correction_preset.correction.bypass)
DECOUPLED = next(entry for entry in CORRECTIONS if not entry.correction_preset.correction.bypass)
CASES = [(entry.name, name) for entry in (*REGISTRY, BYPASS, DECOUPLED) for name in SETTINGS]


@pytest.mark.parametrize(("method", "setting"), CASES)
def test_a_learner_reads_its_settings_and_refuses_the_others(method, setting):
    if method in expected_readers(setting):
        config = resolve_config(None, None, method=method, **{setting: VALID[setting]})
        assert getattr(config, setting) == VALID[setting]
        return
    flag = "--" + setting.replace("_", "-")
    readers = ", ".join(expected_names(setting)).replace("presets", "presets (docs/corrections.md)")
    with pytest.raises(UserError) as refused:
        resolve_config(None, None, method=method, **{setting: VALID[setting]})
    assert str(refused.value) == f"{flag} is not read by {method}; it is read by {readers}"


def test_the_issues_examples_are_refused_also_from_a_config_file_but_a_presets_value_is_dropped(tmp_path):
    for method, setting in (("pg", "beta"), ("pg", "horizon"), ("cispo", "beta"), ("rft", "beta")):
        with pytest.raises(UserError, match=f"is not read by {method}; it is read by"):
            resolve_config(None, None, method=method, **{setting: VALID[setting]})
    path = tmp_path / "pg.toml"
    path.write_text('method = "pg"\nbeta = 0.5\n')
    with pytest.raises(UserError, match="--beta is not read by pg; it is read by ggpo, ggpo-clip"):
        resolve_config(None, path)
    # The tiny preset's T_ref = 8 tunes the learners that refresh by default and is dropped for the others.
    assert resolve_config("tiny", None, method="pg").ref_refresh is None
    assert resolve_config("tiny", None, method="is-free").ref_refresh == 8
    assert resolve_config("tiny", None, method="grpo").ref_refresh is None


def test_the_ranges_follow_the_learner():
    for entry in REGISTRY:
        if "beta" not in entry.hyperparameters:
            continue
        if "beta" not in entry.bounds:  # the field's own range: β = 0 is PG
            assert resolve_config(None, None, method=entry.name, beta=0.0).beta == 0.0
            with pytest.raises(UserError, match="--beta must be >= 0, got -0.1"):
                resolve_config(None, None, method=entry.name, beta=-0.1)
        else:  # the loss divides by β
            assert entry.bounds["beta"] == POSITIVE
            with pytest.raises(UserError, match=f"--beta must be > 0 for {entry.name}, got 0.0"):
                resolve_config(None, None, method=entry.name, beta=0.0)
    assert {e.name for e in REGISTRY if "beta" in e.hyperparameters and "beta" not in e.bounds} == {
        "proximal-kl",
        "seq-is",
        "is-free",
    }
    with pytest.raises(UserError, match="--horizon must be >= 0 or 'full'"):
        resolve_config(None, None, method="seq-is", horizon=-1)


def test_the_method_resolves_to_its_learner_once():
    assert TrainConfig(method="grpo-tis").learner is learner("grpo-tis")
    with pytest.raises(UserError, match="unknown method 'ppo'; choose from ggpo, ggpo-clip"):
        TrainConfig(method="ppo").learner  # noqa: B018
    package = REPO / "ggpo_offline"
    indexing = [
        f"{path.relative_to(REPO)}:{number}"
        for path in package.rglob("*.py")
        if path.name != "learners.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "LEARNERS[" in line
    ]
    assert indexing == []


def test_compare_refuses_a_setting_no_compared_method_reads_and_gives_each_run_its_own(tmp_path):
    config = CompareConfig(pool=tmp_path / "p.parquet", methods=("grpo", "ggpo"), seeds=(1,), out=tmp_path)
    with pytest.raises(UserError, match="--cispo-low is not read by grpo, ggpo; it is read by cispo$"):
        run_configs(replace(config, settings={"cispo_low": 0.5}))
    runs = run_configs(replace(config, settings={"beta": 0.5, "kl_coef": 0.02}))
    by_method = {run.method: run for run in runs}
    assert (by_method["ggpo"].beta, by_method["ggpo"].kl_coef) == (0.5, TrainConfig.kl_coef)
    assert (by_method["grpo"].beta, by_method["grpo"].kl_coef) == (TrainConfig.beta, 0.02)
    shared = replace(config, settings={"beta": 0.5, "kl_coef": 0.02})
    commands = {run.method: train_command(run, shared) for run in runs}  # each one `ggpo train` accepts
    assert "--beta 0.5" in commands["ggpo"] and "--kl-coef" not in commands["ggpo"]
    assert "--kl-coef 0.02" in commands["grpo"] and "--beta" not in commands["grpo"]


def test_each_runs_train_command_is_accepted_when_a_shared_config_file_sets_other_learners_settings(tmp_path):
    from ggpo_cli.main import main

    (tmp_path / "shared.toml").write_text("beta = 0.5\nkl_coef = 0.02\nupdates = 3\n")
    config = CompareConfig(
        pool=tmp_path / "p.parquet",
        methods=("grpo", "ggpo"),
        seeds=(1,),
        config_file=tmp_path / "shared.toml",
        settings={"lr": 0.001},
        out=tmp_path,
    )
    trained = []

    def capture(resolved, **_):
        trained.append(resolved)

    for run in run_configs(config):
        words = shlex.split(train_command(run, config))
        assert "--config" not in words
        with (
            mock.patch("ggpo_offline.train.dry_run.plan_run"),  # no pool: the settings are the point
            mock.patch("ggpo_offline.train.trainer.train", capture),
            mock.patch("ggpo_cli.terminal.print_training_result"),
        ):
            main(words[1:])
        assert trained[-1] == run  # the command alone rebuilds the run's settings


def _help_texts(command: str) -> dict[str, str]:
    from ggpo_cli.main import app

    click_command = typer.main.get_command(app).commands[command]
    return {param.opts[0]: param.help for param in click_command.params}


def _named(text: str) -> set[str]:
    """The learner names of a "a, b (> 0); c (>= 0)" list."""
    return {name.strip() for name in re.sub(r"\([^)]*\)", "", text).replace(";", ",").split(",")}


@pytest.mark.parametrize("command", ["train", "compare"])
def test_each_learner_flags_help_names_exactly_the_learners_that_read_it(command):
    texts = _help_texts(command)
    for setting in SETTINGS:
        help_text = texts["--" + setting.replace("_", "-")]
        read_by = re.search(r"Read by (.*?)\.(?:\s|$)", help_text)
        assert read_by is not None, (setting, help_text)
        assert _named(read_by.group(1)) == set(expected_names(setting)), setting
    beta = re.search(r"Read by (.*?)\.(?:\s|$)", texts["--beta"]).group(1)
    positive, non_negative = beta.split(";")
    assert positive.endswith("(> 0)") and "(" not in non_negative  # the field's own range: β >= 0
    assert _named(non_negative) == {"proximal-kl", "seq-is", "is-free"}
    refreshing = re.search(r"\[default: 160 \(or the preset's\) for ([^;]*);", texts["--ref-refresh"])
    assert _named(refreshing.group(1)) == {entry.name for entry in REGISTRY if entry.refreshes_reference}
    if command == "train":  # compare chooses the method of each run
        methods = texts["--method"].removeprefix("Learner: ").split(" (")[0]
        assert _named(methods) == {entry.name for entry in REGISTRY + CORRECTIONS}


def test_the_readme_learner_table_is_the_registrys():
    readme = (REPO / "README.md").read_text()
    assert readme.count(README_BEGIN) == 1 and readme.count(README_END) == 1
    block = readme.split(README_BEGIN)[1].split(README_END)[0]
    assert block == "\n" + markdown_table(), "run `python tools/write_learner_tables.py` to regenerate it"


def test_the_corrections_doc_holds_every_preset_as_the_registry_has_it():
    doc = (REPO / "docs" / "corrections.md").read_text()
    assert with_corrections_table(doc) == doc, "run `python tools/write_learner_tables.py` to regenerate it"
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    presets = [row for row in rows if "framework" not in row and "§" in row]
    assert [row.split("`")[1] for row in presets] == [entry.name for entry in CORRECTIONS]
    for entry, row in zip(CORRECTIONS, presets, strict=True):
        assert f"`{entry.correction_preset.knobs}`" in row and entry.summary in row


def test_the_docs_list_each_ablation_where_the_readme_lists_the_methods():
    doc = (REPO / "docs" / "learners.md").read_text()
    assert with_ablations_table(doc) == doc, "run `python tools/write_learner_tables.py` to regenerate"
    ablations = [entry.name for entry in REGISTRY if entry.ablates]
    assert ablations == ["ggpo-bounded-push"]
    assert [row.split("`")[1] for row in markdown_table(ablations=True).splitlines()[2:]] == ablations
    assert not any(f"`{name}`" in markdown_table() for name in ablations)


@pytest.mark.parametrize("ablations", [False, True])
def test_the_table_has_a_row_per_learner_with_its_facts(ablations):
    rows = markdown_table(ablations).splitlines()[2:]
    entries = [entry for entry in REGISTRY if (entry.ablates is not None) == ablations]
    assert len(rows) == len(entries)
    for entry, row in zip(entries, rows, strict=True):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[:3] == [f"`{entry.name}`", entry.label, entry.summary]
        assert re.findall(r"`--([a-z-]+)`", cells[3]) == [n.replace("_", "-") for n in entry.hyperparameters]
        assert ("π_ref" in cells[4]) == ("ref_logp" in entry.needs)
        assert ("every 160" in cells[5]) == entry.refreshes_reference
        assert cells[6] == entry.formula
    if not ablations:
        assert "beta = 0 (fixed)" in rows[[e.name for e in entries].index("pg")]


def test_the_generator_rewrites_only_the_block(tmp_path):
    readme = f"# Title\n\nBefore.\n\n{README_BEGIN}\nstale table\n{README_END}\n\nAfter.\n"
    rewritten = with_learner_table(readme)
    assert rewritten == f"# Title\n\nBefore.\n\n{README_BEGIN}\n{markdown_table()}{README_END}\n\nAfter.\n"
    assert with_learner_table(rewritten) == rewritten
    path = tmp_path / "README.md"
    path.write_text(readme)
    subprocess.run([sys.executable, "tools/write_learner_tables.py", str(path)], check=True, cwd=REPO)
    assert path.read_text() == rewritten
    with pytest.raises(UserError, match="needs one <!-- learners:begin --> line"):
        with_learner_table("# no markers\n")


def test_the_cli_refuses_an_unread_flag_with_one_line(tmp_path):
    ggpo = Path(sys.executable).parent / "ggpo"
    result = subprocess.run(
        [str(ggpo), "train", "--pool", str(tmp_path / "none.parquet"), "--method", "pg", "--beta", "0.5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: --beta is not read by pg; it is read by ggpo, ggpo-clip, agro, proximal-kl, seq-is, is-free, "
        "ggpo-reward-only, ggpo-bounded-push"
    ]
