"""The `ggpo` command as a user runs it: a CPU smoke run per command and one clear line per bad input."""

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, read_metric_series, synthetic_metadata, synthetic_rows, write_synthetic_pool

GGPO = [str(Path(sys.executable).parent / "ggpo")]


def ggpo(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The command in a new process, as a user runs it."""
    return subprocess.run(GGPO + list(args), capture_output=True, text=True, cwd=cwd, timeout=600)


def ggpo_here(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The command through the same entry point (`ggpo_cli.main.main`) in this process: what it prints and
    how it exits, without the seconds of imports a new process pays (torch, transformers) before it fails."""
    from ggpo_cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(list(args))
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return subprocess.CompletedProcess(["ggpo", *args], code, stdout.getvalue(), stderr.getvalue())


def assert_one_error_line(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def test_help_does_not_import_vllm_or_torch():
    code = "import sys, ggpo_cli.main; print('vllm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    result = ggpo("--help")
    assert result.returncode == 0 and "generate-pool" in result.stdout


def test_generate_pool_with_the_hf_engine_end_to_end(tmp_path):
    out = tmp_path / "hf.parquet"
    result = ggpo(
        "generate-pool",
        "--engine",
        "hf",
        "--num-prompts",
        "6",
        "-m",
        "4",
        "--max-tokens",
        "48",
        "--seed",
        "3",
        "--out",
        str(out),
        "--reward-workers",
        "1",
    )
    assert result.returncode == 0, result.stderr
    assert "mixed groups" in result.stdout and "mean reward" in result.stdout
    validated = ggpo("pool", "validate", str(out))
    assert validated.returncode == 0
    assert (
        validated.stdout.strip()
        == f"{out}: valid pool, 6 groups x 4 = 24 responses, "
        + validated.stdout.strip().split("responses, ")[1]
    )
    inspected = ggpo("pool", "inspect", str(out))
    assert inspected.returncode == 0 and '"engine"' in inspected.stdout and "hf" in inspected.stdout


def test_unknown_model_path(tmp_path):
    result = ggpo_here(
        "generate-pool", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "p.parquet")
    )
    assert_one_error_line(result, "no such model folder")
    assert not (tmp_path / "p.parquet").exists()


def test_dataset_with_missing_columns(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "What is 1 + 1?", "gold": "2"}) + "\n")
    result = ggpo_here("generate-pool", "--dataset", str(data), "--out", str(tmp_path / "p.parquet"))
    assert_one_error_line(result, "column")
    result = ggpo_here(
        "generate-pool",
        "--dataset",
        str(data),
        "--problem-key",
        "text",
        "--answer-key",
        "answer",
        "--out",
        str(tmp_path / "p.parquet"),
    )
    assert_one_error_line(result, "'answer'")
    assert not (tmp_path / "p.parquet").exists()


def test_empty_dataset(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    result = ggpo_here("generate-pool", "--dataset", str(data), "--out", str(tmp_path / "p.parquet"))
    assert_one_error_line(result, "empty")


def test_existing_output_is_not_overwritten(tmp_path):
    out = write_synthetic_pool(tmp_path / "keep.parquet")
    before = out.read_bytes()
    result = ggpo_here("generate-pool", "--out", str(out))
    assert_one_error_line(result, "already exists; pass --overwrite")
    assert out.read_bytes() == before


def test_validate_corrupted_pool(tmp_path):
    out = write_synthetic_pool(tmp_path / "p.parquet", groups=30)
    data = out.read_bytes()
    out.write_bytes(data[: len(data) - 40])
    result = ggpo_here("pool", "validate", str(out))
    assert result.returncode == 1
    assert_one_error_line(result, "not a readable Parquet file")
    assert_one_error_line(ggpo_here("pool", "inspect", str(out)), "not a readable Parquet file")


def test_bad_flag_values_are_one_line(tmp_path):
    result = ggpo_here("generate-pool", "--temperature", "0", "--out", str(tmp_path / "p.parquet"))
    assert_one_error_line(result, "--temperature must be > 0")
    result = ggpo_here("generate-pool", "--engine", "tgi", "--out", str(tmp_path / "q.parquet"))
    assert_one_error_line(result, "unknown --engine 'tgi'; choose one of vllm, hf")


def test_pool_inspect_shows_the_pools_answer_rule(tmp_path, capsys, monkeypatch):
    from ggpo_cli import terminal

    from ggpo_offline.pool.inspect import pool_summary

    monkeypatch.setattr(terminal.stdout, "_width", 200)  # one table row per line
    shown = {}
    for name, reward in [("number", {"answer_rule": "number"}), ("older", {"timeouts": 0})]:
        pool = write_synthetic_pool(
            tmp_path / f"{name}.parquet", metadata={**synthetic_metadata(4), "reward": reward}
        )
        terminal.print_summary(pool_summary(pool))
        shown[name] = next(line for line in capsys.readouterr().out.splitlines() if "answer rule" in line)
    assert shown["number"].split("answer rule")[1].strip(" │") == "number"
    assert shown["older"].split("answer rule")[1].strip(" │") == "not recorded (an older pool: math-verify)"


@pytest.mark.parametrize("what", ["validate", "inspect"])
def test_pool_commands_on_a_missing_file(tmp_path, what):
    assert_one_error_line(ggpo_here("pool", what, str(tmp_path / "missing.parquet")), "no such pool file")


def test_train_command_end_to_end_with_mlflow(vllm_pool, tmp_path):

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    out = tmp_path / "run"
    args = [
        "train",
        "--pool",
        str(vllm_pool),
        "--method",
        "grpo",
        "--updates",
        "2",
        "--groups-per-batch",
        "2",
        "--out",
        str(out),
        "--tracking-uri",
        uri,
        "--lr",
        "1e-4",
    ]
    result = ggpo(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "resolved config" in result.stdout and "final model" in result.stdout
    shown = {line.split("│")[1].strip() for line in result.stdout.splitlines() if line.count("│") == 3}
    assert {"method", "lr", "ref_refresh", "run folder"} <= shown  # what GRPO reads, and where it goes
    assert shown.isdisjoint({"beta", "clip", "horizon", "cost_bound", "cispo_low", "tis_block"}), shown
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    run_id = result.stdout.split("MLflow run: ")[1].split()[0]
    series = read_metric_series(uri, run_id)
    assert [value for _, value in series["mismatch/drift"]] == [r["mismatch/drift"] for r in records]
    assert_one_error_line(ggpo_here(*args, cwd=tmp_path), "already exists; pass --resume")
    # The final model is a Hugging Face folder that vLLM loads: test_train's evaluation test samples from one
    # in a fresh `ggpo eval`. Unknown methods and missing pools are refused in-process (test_train,
    # test_pool); the one-line path of `train` is the --resume refusal above.


def test_every_library_package_is_listed_for_installation():
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(path.parent.relative_to(REPO).parts) for path in (REPO / "ggpo_offline").rglob("__init__.py")
    }
    assert found | {"ggpo_cli"} == listed


def test_compare_command_reports_and_refuses_bad_input(vllm_pool, tmp_path):
    out = tmp_path / "report"
    args = ["compare", "--pool", str(vllm_pool), "--methods", "grpo,ggpo", "--seeds", "3", "--updates", "2"]
    args += ["--groups-per-batch", "2", "--eval-every", "2", "--eval-n", "2", "--eval-k", "1,2", "--no-test"]
    args += ["--eval-num-problems", "4", "--eval-engine", "hf", "--no-tracking", "--out", str(out)]
    result = ggpo(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    fingerprint = json.loads((out / "runs" / "ggpo-s3" / "result.json").read_text())["data_order_fingerprint"]
    assert f"seed 3: data-order fingerprint {fingerprint} shared by all 2 runs" in result.stdout
    assert "| update | GRPO | GGPO |" in result.stdout and f"report: {out}/README.md" in result.stdout
    assert "grpo-s3: queued\nggpo-s3: queued\ngrpo-s3: running\n" in result.stderr
    assert result.stderr.endswith("ggpo-s3: done\n")

    again = ggpo_here(*args, cwd=tmp_path)
    assert again.returncode == 0 and "ggpo-s3: done reused" in again.stderr
    # Changed settings and a folder of the user's own are refused in-process (test_compare).


def test_pool_score_writes_the_pi0_cache_once(vllm_pool, tmp_path):
    import shutil

    from ggpo_offline.train.pi0_cache import ensure_pi0_cache

    pool = tmp_path / "pool.parquet"
    shutil.copy(vllm_pool, pool)
    result = ggpo("pool", "score", str(pool), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cache = Path(result.stdout.split("π0 cache: ")[1].splitlines()[0].strip())
    assert "sampler against the learner before any update" in result.stdout  # and its measures
    assert cache.parent == tmp_path and cache.name.startswith("pool.pi0-") and cache.is_file()
    stamp = cache.stat().st_mtime_ns
    _, found = ensure_pi0_cache(pool)
    assert found.path == cache and cache.stat().st_mtime_ns == stamp  # found, not rescored
    assert_one_error_line(ggpo_here("pool", "score", str(tmp_path / "none.parquet")), "no such pool file")


def test_train_with_an_unreachable_tracking_server_stops_before_training(tmp_path, tiny_dir, monkeypatch):
    import socket

    rows = synthetic_rows(groups=4, m=4)
    for row in rows:
        row["reward"] = float(row["sample_idx"] % 2)  # every group mixed, so the plan has data
    pool = write_synthetic_pool(tmp_path / "pool.parquet", rows=rows, m=4)
    args = ["train", "--pool", str(pool), "--model", str(tiny_dir), "--allow-tokenizer-mismatch"]
    args += ["--updates", "1", "--groups-per-batch", "1", "--out", str(tmp_path / "run")]
    with socket.socket() as closed:  # a bound loopback port that is not listening refuses connections
        closed.bind(("127.0.0.1", 0))
        server = f"http://127.0.0.1:{closed.getsockname()[1]}"
        assert_one_error_line(
            ggpo_here(*args, "--tracking-uri", server, cwd=tmp_path),
            f"MLflow tracking server {server} is unreachable",
        )
        assert not (tmp_path / "run").exists()  # nothing trained, nothing written
        # --no-tracking never contacts a store, even when the environment names the unreachable one.
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
        result = ggpo_here(*args, "--no-tracking", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "final").is_dir() and not (tmp_path / "mlruns.db").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["build-tiny-model"], "Missing option '--out'"),
        (["train", "--updates", "ten"], "Invalid value for '--updates'"),
    ],
)
def test_usage_errors_are_click_messages_without_a_traceback(args, expected):
    done = ggpo_here(*args)
    assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr


def test_train_refuses_a_missing_pool_before_showing_its_settings(tmp_path):
    result = ggpo_here("train", "--pool", str(tmp_path / "absent.parquet"), "--method", "grpo")
    assert_one_error_line(result, "absent.parquet: no such pool file or directory")
    assert result.stdout == ""


MALFORMED_CONFIGS = {
    "bad.yaml": ("updates: [1, 2\nlr: 3\n", "expected ',' or ']', but got ':' at line 2, column 3"),
    "bad.yml": ("a: b: c\n", "mapping values are not allowed here at line 1, column 5"),
    "bad.toml": ("updates = \n", "Invalid value (at line 1, column 11)"),
    "bad.json": ('{"updates": }', "Expecting value: line 1 column 13"),
    "binary.yaml": (b"\xff\xfe\x00", "'utf-8' codec can't decode byte 0xff"),
    "list.yaml": ("- 1\n", "expected a mapping of settings"),
}


@pytest.mark.parametrize("command", ["train", "compare"])
@pytest.mark.parametrize("name", sorted(MALFORMED_CONFIGS))
def test_a_malformed_config_file_is_one_line_naming_it(tmp_path, command, name):
    content, problem = MALFORMED_CONFIGS[name]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    pool = write_synthetic_pool(tmp_path / "pool.parquet")
    result = ggpo_here(command, "--config", str(path), "--pool", str(pool), "--out", str(tmp_path / "out"))
    assert_one_error_line(result, f"--config {path}: ")
    assert problem in result.stderr and result.stdout == ""
    assert not (tmp_path / "out").exists()
