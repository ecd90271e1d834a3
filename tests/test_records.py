"""The records that cross a package: each written and read through its one type, round-tripping, reading the
files a real run writes byte for byte, and no other module parsing JSON."""

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ggpo_offline.compare.manifest import MARKER, CompareManifest, ManifestRun
from ggpo_offline.core.errors import UserError
from ggpo_offline.evaluate.config import TrainingEvalConfig
from ggpo_offline.train import metric_names
from ggpo_offline.train.checkpoint import RankState, RunState, load_state, resume_point
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.run_folder import STATE_FILE, RunFolder
from ggpo_offline.train.run_records import CONFIG_FILE, RESULT_FILE, RunId, RunResult, RunSettings

REPO = Path(__file__).resolve().parents[1]

JSON_READERS = {
    "ggpo_offline/train/run_records.py": "config.json (RunSettings) and result.json (RunResult)",
    "ggpo_offline/train/run_folder.py": "metrics.jsonl and profile.jsonl: one metric record (keyed by"
    " metric_names) or PhaseTime per line",
    "ggpo_offline/train/config.py": "TrainConfig.to_dict's JSON round trip (paths as strings): no file",
    "ggpo_offline/train/pi0_cache.py": "the π0 cache's key, in the cache's own Parquet footer",
    "ggpo_offline/train/launch.py": "a rank's failure report to its launcher",
    "ggpo_offline/train/rounds.py": "a run's rounds/rounds.json (RoundRecord)",
    "ggpo_offline/evaluate/eval_report.py": "an evaluation report (EvalReport)",
    "ggpo_offline/compare/counts.py": "counts.json (Counts)",
    "ggpo_offline/compare/arc.py": "ablations.json (AblationRun)",
    "ggpo_offline/compare/against_ceilings.py": "the --ceilings report of `measure-styles --json`",
    "ggpo_offline/pool/schema.py": "the pool footer (PoolInfo)",
    "ggpo_offline/pool/partial.py": "a partial pool's progress record",
    "ggpo_offline/jobs/slurm.py": "jobs.json (SubmittedTasks): the Slurm tasks a command submitted",
    "ggpo_offline/importing/jsonl.py": "other tools' rollout rows (JSONL)",
    "ggpo_offline/generate/engines/base.py": "a Hugging Face model's config.json",
    "ggpo_offline/core/model_io.py": "a Hugging Face model's eos_token_id",
    "ggpo_offline/organism/tiny.py": "the tiny model's Hugging Face config.json",
    "ggpo_offline/organism/rehearsal.py": "the rehearsal model's Hugging Face config.json",
    "ggpo_offline/core/settings.py": "a --config file (settings are their own record)",
    "ggpo_offline/core/errors.py": "read_versioned: compare.json, tuning.json, report.json for their types",
}
"""Every module that parses JSON, and the record it owns: a record's keys are read in its module alone."""


def json_readers() -> dict[str, int]:
    """Module path -> line of its first `json.load(s)` (called or passed), in the library and the CLI."""
    found = {}
    for path in sorted([*(REPO / "ggpo_offline").rglob("*.py"), *(REPO / "cli").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = isinstance(node, ast.Attribute) and node.attr in ("load", "loads")
            imported = isinstance(node, ast.ImportFrom) and node.module == "json"
            if (named and isinstance(node.value, ast.Name) and node.value.id == "json") or imported:
                found.setdefault(str(path.relative_to(REPO)), node.lineno)
    return found


def test_json_is_parsed_only_in_the_modules_that_own_a_record():
    readers = json_readers()
    strays = {path: line for path, line in readers.items() if path not in JSON_READERS}
    assert strays == {}, "read the file through its record type (or list the module and its record)"
    assert sorted(set(JSON_READERS) - set(readers)) == []  # no stale entry


def test_a_run_id_names_its_folder_and_parses_back():
    for run in (RunId("grpo", 1), RunId("verl-decoupled-geo-rs", 42), RunId("a-s1", 7)):
        assert RunId.parse(run.folder_name) == run
    assert RunId("ggpo", 1234).folder_name == "ggpo-s1234"
    assert TrainConfig(method="grpo", seed=3).run_name == "grpo-s3"
    for bad in ("grpo", "grpo-sx", "-s1", "grpo-s", "grpo-s-1"):
        message = rf"^'{bad}' is not a run's name: <method>-s<seed>, e\.g\. grpo-s1$"
        with pytest.raises(UserError, match=message):
            RunId.parse(bad)


def test_run_settings_write_the_bytes_of_config_json_and_read_back(tmp_path):
    evaluation = TrainingEvalConfig(eval_ks=(1, 2))
    config = TrainConfig(pool="pool.parquet", method="ggpo", lr=3e-4, evaluation=evaluation, out=tmp_path)
    fingerprints = {"pool_fingerprint": "p" * 64, "data_order_fingerprint": "d" * 64}
    RunSettings.of(config, fingerprints).write(tmp_path)
    text = (tmp_path / CONFIG_FILE).read_text()
    assert text == json.dumps({"format": 2, **config.to_dict(), **fingerprints}, indent=2)
    settings = RunFolder(tmp_path).read_settings()
    assert settings == RunSettings.of(config, fingerprints) and RunSettings.FORMATS == (1, 2)
    assert (settings.pool, settings.lr, settings.beta, settings.eval_n) == ("pool.parquet", 3e-4, 0.01, 32)
    assert (settings.method, settings.sync_every, settings.pool_fingerprint) == ("ggpo", None, "p" * 64)
    assert settings.only(("eval_ks", "removed_long_ago")) == {"eval_ks": [1, 2], "removed_long_ago": None}
    # A format-1 file (what runs wrote before the key) reads the same; a later format is one line.
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config.to_dict(), **fingerprints}, indent=2))
    assert RunSettings.read(tmp_path) == settings
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"format": 3, **settings.values}))
    with pytest.raises(UserError, match=r"config\.json has format 3; this ggpo-offline reads format 1, 2$"):
        RunSettings.read(tmp_path)
    assert settings.only(("method", "seed")) == {"method": "ggpo", "seed": 42}
    assert settings.without(("lr",)) == {k: v for k, v in settings.values.items() if k != "lr"}
    assert RunSettings.read(tmp_path / "never-started") == RunSettings({})


def test_run_result_round_trips_and_marks_the_run_finished(tmp_path):
    assert not RunFolder(tmp_path).is_finished()
    result = RunResult(run_id=None, pool_fingerprint="p", updates=4, final_model="final", selected_update=2)
    result.write(tmp_path)
    assert RunResult.read(tmp_path) == result and RunFolder(tmp_path).read_result() == result
    assert (tmp_path / RESULT_FILE).read_text() == json.dumps(
        {"format": 2, **result.to_dict()}, indent=2
    ) + "\n"
    assert RunFolder(tmp_path).is_finished()
    (tmp_path / RESULT_FILE).write_text(json.dumps(result.to_dict()))  # format 1: no key
    assert RunResult.read(tmp_path) == result


MANIFEST = """{
  "format": 2,
  "status": "finished",
  "tool_version": "0.1.0",
  "updated": "2026-01-02T03:04:05+00:00",
  "command": "ggpo compare --pool pool.parquet --methods grpo,ggpo --seeds 1",
  "pool": "pool.parquet",
  "methods": [
    "grpo",
    "ggpo"
  ],
  "seeds": [
    1
  ],
  "runs": {
    "grpo-s1": {
      "folder": "reports/x/runs/grpo-s1",
      "action": "train"
    },
    "ggpo-s1": {
      "folder": "reports/x/runs/ggpo-s1",
      "action": "reuse"
    }
  },
  "data_order_fingerprints": {
    "1": "abc"
  }
}
"""
"""A compare.json as `ggpo compare` writes it (its keys, order and layout)."""


def test_the_compare_manifest_reads_back_and_writes_the_same_bytes(tmp_path):
    (tmp_path / MARKER).write_text(MANIFEST)
    manifest = CompareManifest.read(tmp_path)
    assert manifest.runs["ggpo-s1"] == ManifestRun("reports/x/runs/ggpo-s1", "reuse")
    assert (manifest.methods, manifest.seeds, manifest.FORMATS) == (("grpo", "ggpo"), (1,), (1, 2))
    assert manifest.run_folders() == {
        RunId("grpo", 1): Path("reports/x/runs/grpo-s1"),
        RunId("ggpo", 1): Path("reports/x/runs/ggpo-s1"),
    }
    out = tmp_path / "again"
    out.mkdir()
    manifest.write(out)
    assert (out / MARKER).read_text() == MANIFEST and CompareManifest.read(out) == manifest
    (out / MARKER).write_text(MANIFEST.replace('"format": 2,\n  ', ""))  # format 1, as reports committed it
    assert CompareManifest.read(out) == manifest
    with pytest.raises(UserError, match=r"no compare\.json; give folders written by ggpo compare$"):
        CompareManifest.read(tmp_path / "elsewhere")


def test_checkpoint_states_round_trip_and_an_older_one_reads_without_what_it_lacks(tmp_path):
    run = RunState(3, {"state": {}}, [torch.ones(2)], torch.get_rng_state(), "r1", {"lr": 1.0}, 2)
    rank = RankState(torch.zeros(2), None, None, probe_pi0=torch.ones(1))
    assert list(run.to_dict()) == [
        "format", "update", "optimizer", "ess_log_weights", "torch_rng", "run_id", "config", "world",
    ]  # fmt: skip
    assert list(rank.to_dict()) == ["format", "ref_window", "old_window", "optimizer", "probe_pi0"]
    torch.save(run.to_dict(), tmp_path / STATE_FILE)
    torch.save(rank.to_dict(), tmp_path / "rank-000.pt")
    read_run, read_rank = load_state(tmp_path, rank=0)
    assert (read_run.update, read_run.run_id, read_run.config, read_run.world) == (3, "r1", {"lr": 1.0}, 2)
    assert torch.equal(read_run.torch_rng, run.torch_rng) and torch.equal(read_rank.probe_pi0, torch.ones(1))
    older = {k: v for k, v in run.to_dict().items() if k not in ("format", "world")}  # format 1
    assert RunState.from_dict(older, tmp_path / STATE_FILE).world is None
    first = {"ref_window": None, "old_window": None, "optimizer": None}
    assert RankState.from_dict(first, tmp_path / "rank-000.pt").probe_pi0 is None
    with pytest.raises(
        UserError, match=r"trainer_state\.pt has format 3; this ggpo-offline reads format 1, 2$"
    ):
        RunState.from_dict({**run.to_dict(), "format": 3}, tmp_path / STATE_FILE)
    assert load_state(tmp_path, rank=None)[1] is None


def test_a_trained_runs_files_read_through_their_records(hf_pool, tmp_path):
    """config.json, result.json and the checkpoint state of a real run, each read and written again."""
    from ggpo_offline.train.distributed import SINGLE_PROCESS
    from ggpo_offline.train.trainer import train

    config = TrainConfig(
        pool=hf_pool, method="ggpo", updates=2, groups_per_batch=2, save_every=1, no_tracking=True,
        out=tmp_path / "run",
    )  # fmt: skip
    result = train(config)
    folder = RunFolder(result.run_dir)
    text = folder.config_file.read_text()
    settings = folder.read_settings()
    assert {"format": 2, **settings.values} == json.loads(text) and settings.updates == 2
    assert settings.method == "ggpo" and settings.pool == str(hf_pool)
    copy = tmp_path / "copy"
    copy.mkdir()
    settings.write(copy)
    assert (copy / CONFIG_FILE).read_text() == text
    finished = folder.read_result()
    assert finished.updates == 2 and finished.pool_fingerprint == settings.pool_fingerprint
    assert json.dumps({"format": 2, **finished.to_dict()}, indent=2) + "\n" == folder.result_file.read_text()
    checkpoint = resume_point(folder, config, SINGLE_PROCESS)
    run_state, rank_state = load_state(checkpoint, rank=0)
    raw = torch.load(checkpoint / STATE_FILE, weights_only=False)
    assert list(run_state.to_dict()) == list(raw) and run_state.config == config.to_dict()
    assert (run_state.update, run_state.world, run_state.run_id) == (2, 1, None)
    assert set(rank_state.to_dict()) == set(torch.load(checkpoint / "rank-000.pt", weights_only=False))
    metrics = folder.read_metrics()
    assert [row[metric_names.UPDATE] for row in metrics] == [0, 1]
    assert {metric_names.LOSS, metric_names.MISMATCH_DRIFT, metric_names.GRAD_NORM} <= set(metrics[0])
    with pytest.raises(UserError, match="the settings differ"):
        resume_point(folder, replace(config, lr=2e-6), SINGLE_PROCESS)


def test_the_reports_diagnostics_are_metric_names():
    from ggpo_offline.compare.report import DIAGNOSTICS

    logged = {value for name, value in vars(metric_names).items() if name.isupper()}
    assert set(DIAGNOSTICS) <= logged
