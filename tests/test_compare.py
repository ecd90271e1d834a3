"""`ggpo compare`: the data-plan check, run reuse, and the report from a real pool (tables: test_report)."""

import csv
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from conftest import count_pool_passes, read_metric_series
from test_cli import GGPO, ggpo

from ggpo_offline.compare.comparison import CompareConfig, compare, run_configs
from ggpo_offline.compare.figures import CHECKPOINT_FIGURES
from ggpo_offline.compare.report import FIGURES, Counts, RunRecord, check_data_plans, write_tables
from ggpo_offline.compare.run_jobs import TrainJob
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import to_flags
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import STOP_VARIABLE
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.run_records import RunResult, RunSettings

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _refuse(name: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"{name} called")

    return refused


def _record(method: str, seed: int, plan: str = "plan", pool: str = "pool") -> RunRecord:
    """A finished run as `check_data_plans` reads it: its result's fingerprints alone."""
    return RunRecord(
        method=method,
        seed=seed,
        run_dir=Path(f"runs/{method}-s{seed}"),
        settings=RunSettings({"eval_n": 4}),
        result=RunResult(pool_fingerprint=pool, data_order_fingerprint=plan),
        evals={},
        metrics=[],
    )


def test_compare_refuses_runs_of_a_seed_that_did_not_share_a_data_plan():
    runs = [
        _record("grpo", 1, "a"),
        _record("ggpo", 1, "a"),
        _record("grpo", 2, "b"),
        _record("ggpo", 2, "b"),
    ]
    assert check_data_plans(runs) == {1: "a", 2: "b"}
    with pytest.raises(
        UserError, match=r"seed 2: the runs do not share one data plan \(grpo-s2 b, ggpo-s2 c"
    ):
        check_data_plans(runs[:3] + [_record("ggpo", 2, "c")])
    with pytest.raises(UserError, match="trained on 2 different pools; refusing to report"):
        check_data_plans([_record("grpo", 1, pool="p"), _record("ggpo", 1, pool="q")])


def test_compare_settings_are_checked_before_any_work(vllm_pool, tmp_path):
    with pytest.raises(UserError, match="unknown method 'ppo'"):
        CompareConfig(pool=vllm_pool, methods=("grpo", "ppo"), out=tmp_path / "r")
    config = CompareConfig(pool=vllm_pool, methods=("grpo",), out=tmp_path / "r")
    with pytest.raises(UserError, match="a seed is listed twice"):
        replace(config, seeds=(1, 1))
    with pytest.raises(UserError, match="compare chooses seed for each run"):
        replace(config, settings={"seed": 3})
    runs = run_configs(replace(config, methods=("grpo", "ggpo"), seeds=(5,), preset="tiny"))
    assert [r.run_dir for r in runs] == [
        tmp_path / "r" / "runs" / "grpo-s5",
        tmp_path / "r" / "runs" / "ggpo-s5",
    ]
    assert {r.evaluation.eval_every for r in runs} == {10}  # the tiny preset's own
    runs = run_configs(replace(config, methods=("grpo",), seeds=(5,), settings={"updates": 30}))
    assert [r.evaluation.eval_every for r in runs] == [6]  # U/5 by default (paper: 80 of 400)

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="is not empty and holds no comparison report"):
        compare(replace(config, methods=("grpo",), out=tmp_path / "mine"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.vllm
def test_compare_trains_every_run_reports_and_reuses_finished_runs(
    vllm_pool, vllm_engine, tmp_path, monkeypatch, capsys
):
    from ggpo_cli import terminal
    from mlflow.tracking import MlflowClient
    from test_report import refuse_reading_back

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    settings = {
        "updates": 4,
        "groups_per_batch": 2,
        "eval_every": 2,
        "eval_n": 4,
        "eval_num_problems": 8,
        "no_test": True,  # the test split's table: test_report
        "eval_ks": (1, 2, 4),
        "tracking_uri": uri,
    }
    config = CompareConfig(
        pool=vllm_pool,
        methods=("grpo", "ggpo"),
        seeds=(1, 2),
        preset="tiny",
        settings=settings,
        out=tmp_path / "r",
    )
    passes = count_pool_passes(monkeypatch)
    result = compare(config, engine=vllm_engine)
    # The pool is read once for the four runs, the π0 cache and the README.
    assert passes == {"validate_pool": 1, "index_pool": 1, "pool_fingerprint": 1, "pool_summary": 1}
    report = tmp_path / "r"
    assert result.actions == {"grpo-s1": "train", "ggpo-s1": "train", "grpo-s2": "train", "ggpo-s2": "train"}
    for name in ("table.md", "table.csv", "counts.json", "README.md", "compare.json"):
        assert (report / name).stat().st_size > 0
    for name in FIGURES + CHECKPOINT_FIGURES:
        assert (report / name).read_bytes()[:8] == PNG_SIGNATURE
    # Every evaluated checkpoint's drift from π0 and what it generated, in the counts, the tables and the
    # diagnostics (0 at update 0, where the policy is π0).
    with (report / "diagnostics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    evaluated = [r for r in rows if r["probe/k3"] != ""]
    assert sorted({int(r["update"]) for r in evaluated}) == [0, 2, 4] and len(evaluated) == 12
    assert all(float(r["probe/k3"]) == 0.0 for r in evaluated if r["update"] == "0")
    assert all(0 <= float(r["eval/generated/novel_first_token"]) <= 1 for r in evaluated)
    assert Counts.read(report / "counts.json").probe[("ggpo", 1)][0] == (0, 0.0, 0.0)
    assert "### Accuracy at matched drift" in (report / "table.md").read_text()

    # One data plan per seed, shared by both methods and recorded in the README.
    by_seed = {}
    for record in result.records:
        by_seed.setdefault(record.seed, set()).add(record.result.data_order_fingerprint)
    assert {seed: len(prints) for seed, prints in by_seed.items()} == {1: 1, 2: 1}
    assert result.data_plans == {seed: prints.pop() for seed, prints in by_seed.items()}
    readme = (report / "README.md").read_text()
    assert all(fingerprint in readme for fingerprint in result.data_plans.values())
    assert "ggpo compare --pool" in readme and "--eval-k 1,2,4" in readme
    assert "## Statistics" in readme and "Student's t on seeds − 1 degrees of freedom" in readme
    # GRPO keeps π0 as its reference while GGPO refreshes it: that setting is listed per run, not as shared.
    shared = readme.split("## Settings shared by every run")[1].split("## Settings that differ by run")[0]
    differing = readme.split("## Settings that differ by run")[1].split("## Reproduce")[0]
    assert "| updates | `4` |" in shared and "ref_refresh" not in shared
    assert "| grpo-s1 |" in differing and "ref_refresh" in differing.splitlines()[2]

    # The base model is evaluated once and shared; the table's entries are the seed means of the reports.
    base_counts = {json.dumps(r.evals[0].benchmarks["arith-validation"].counts) for r in result.records}
    assert len(base_counts) == 1 and sorted(result.records[0].evals) == [0, 2, 4]
    grpo = [
        r.evals[4].benchmarks["arith-validation"].mean_at_n * 100
        for r in result.records
        if r.method == "grpo"
    ]
    with (report / "table.csv").open() as handle:
        row = next(
            r
            for r in csv.DictReader(handle)
            if r["table"] == "accuracy" and r["method"] == "grpo" and r["update"] == "4"
        )
    assert float(row["mean"]) == pytest.approx(statistics.fmean(grpo), abs=1e-6)
    # counts.json alone recomputes the tables.
    (tmp_path / "again").mkdir()
    write_tables(Counts.read(report / "counts.json"), tmp_path / "again")
    assert (tmp_path / "again" / "table.md").read_text() == (report / "table.md").read_text()

    # MLflow: one parent, the runs nested under it, eval scores logged at the evaluated updates.
    client = MlflowClient(tracking_uri=uri)
    for record in result.records:
        run = client.get_run(record.result.run_id)
        assert run.data.tags["mlflow.parentRunId"] == result.parent_run_id
        series = read_metric_series(uri, record.result.run_id)
        assert [step for step, _ in series["eval/arith-validation/mean_at_4"]] == [0, 2, 4]
    artifacts = {a.path for a in client.list_artifacts(result.parent_run_id, "report")}
    assert {"report/table.md", "report/counts.json", "report/figure.png", "report/README.md"} <= artifacts

    # Adding a seed trains only the new runs; finished runs are reused untouched.
    stamps = {p: p.stat().st_mtime_ns for p in (report / "runs").rglob("metrics.jsonl")}
    with monkeypatch.context() as guard:  # the README and the terminal show the report as computed
        refuse_reading_back(guard, report)
        bigger = compare(replace(config, seeds=(1, 2, 3)), engine=vllm_engine)
        terminal.print_compare_result(bigger)
    assert bigger.report.table_md in capsys.readouterr().out
    assert bigger.report.table_md == (report / "table.md").read_text()
    assert bigger.report.table_md in (report / "README.md").read_text()
    assert bigger.actions == {
        "grpo-s1": "reuse", "ggpo-s1": "reuse", "grpo-s2": "reuse", "ggpo-s2": "reuse",
        "grpo-s3": "train", "ggpo-s3": "train",
    }  # fmt: skip
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert "seeds 1, 2, 3" in (report / "table.md").read_text()
    reused_parent = client.get_run(result.records[0].result.run_id).data.tags["mlflow.parentRunId"]
    assert reused_parent == bigger.parent_run_id

    # Other settings never silently replace finished runs; --rerun does, with identical results.
    with pytest.raises(
        UserError, match=r"other settings or another pool \(lr: 0.0003 -> 1e-05\); pass --rerun"
    ):
        compare(replace(config, settings={**settings, "lr": 1e-5}), engine=vllm_engine)
    # A setting added after a run was made counts as matching when the wanted value is its default.
    saved_config = report / "runs" / "grpo-s1" / "config.json"
    older = json.loads(saved_config.read_text())
    del older["eval_gpu_memory_fraction"]
    saved_config.write_text(json.dumps(older))
    # A compare that only reuses runs (a report written again) runs no job: it starts no evaluator.
    with monkeypatch.context() as guard:
        guard.setattr(TrainJob, "run", _refuse("TrainJob.run"))
        assert compare(config, engine=vllm_engine).actions["grpo-s1"] == "reuse"
    rerun = compare(replace(config, methods=("grpo",), seeds=(1,), rerun=True), engine=vllm_engine)
    assert rerun.actions == {"grpo-s1": "replace"}
    first = next(r for r in result.records if (r.method, r.seed) == ("grpo", 1))
    assert [r.metrics for r in rerun.records] == [first.metrics]


TWO_UPDATES = {
    "updates": 2,
    "groups_per_batch": 2,
    "eval_every": 2,
    "eval_n": 2,
    "eval_num_problems": 4,
    "no_test": True,
    "no_tracking": True,
}


def test_a_second_compare_on_a_report_folder_in_use_is_refused(vllm_pool, vllm_engine, tmp_path):
    """One compare at a time on a report folder: a second one started while the first runs its jobs is
    refused with one line naming the first (pid, host), and changes nothing."""
    config = CompareConfig(
        pool=vllm_pool,
        methods=("grpo",),
        seeds=(2, 1),
        preset="tiny",
        settings=TWO_UPDATES,
        out=tmp_path / "r",
    )
    beside = {}

    def on_state(name, state):
        if name == "grpo-s2" and state.status == "running" and not beside:
            try:
                compare(replace(config, seeds=(1,)), engine=vllm_engine)
            except UserError as refused:
                beside["refused"] = str(refused)

    result = compare(config, report=on_state, engine=vllm_engine)
    assert beside["refused"] == (
        f"{tmp_path / 'r'} is being written by pid {os.getpid()} on {socket.gethostname()}; a report folder "
        "has one compare: let it finish (or stop it), then run it again"
    )
    assert result.actions == {"grpo-s2": "train", "grpo-s1": "train"}
    updates = [[m["update"] for m in r.metrics] for r in result.records]
    assert updates == [sorted(set(u)) for u in updates] and all(u[-1] == 2 for u in updates)  # each once


def test_each_of_two_workers_gets_its_core_and_openmp_threads_that_sleep_at_a_barrier():
    """The report of two workers equals one's byte for byte (the test below), with the wait policy or not."""
    from ggpo_offline.jobs.local import worker_environments

    assert worker_environments(2, 1, [0, 1], []) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_WAIT_POLICY": "PASSIVE"},
        {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_WAIT_POLICY": "PASSIVE"},
    ]
    assert worker_environments(1, 1, [0, 1], []) == [{}]  # one worker: the caller's own setting


def test_two_workers_give_the_report_of_one_and_a_killed_one_is_one_line_whose_command_continues(
    vllm_pool, tmp_path
):
    """`ggpo compare --jobs 2` as a user runs it, each worker pinned to a core: both stop at update 1
    (GGPO_STOP_AT), one is killed. The compare ends with one line naming the run, its log and the command
    that continues; that command finishes every run, each update once, and the report's files equal those of
    one `ggpo compare` process training the runs one after the other, byte for byte. (The hf evaluation
    engine: what is tested is the launcher, and a worker starts it in a second.)"""
    settings = to_flags({**TWO_UPDATES, "threads": 1, "eval_engine": "hf"}, TrainConfig)
    runs = ["--pool", str(vllm_pool), "--methods", "grpo,ggpo", "--seeds", "1", "--preset", "tiny", *settings]
    out = tmp_path / "two"
    stop = {**os.environ, STOP_VARIABLE: "0:training update 1"}
    two_jobs = [*GGPO, "compare", *runs, "--out", str(out), "--jobs", "2"]
    job = subprocess.Popen(two_jobs, env=stop, stderr=subprocess.PIPE, text=True)
    stopped = []
    while job.poll() is None and not stopped:
        stopped = [w for w in psutil.Process(job.pid).children() if w.status() == psutil.STATUS_STOPPED]
        time.sleep(0.1)
    stopped[0].kill()
    stderr = job.communicate(timeout=600)[1]
    assert job.returncode == 1 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    named = re.fullmatch(
        rf"error: run ((?:grpo|ggpo)-s1) failed: its worker process was killed by signal 9 \(SIGKILL\); "
        rf"its log: {re.escape(str(out))}/logs/\1\.log; the same command continues: (.*)",
        line,
    )
    assert named, line
    command = shlex.split(named[2])  # the line's own command, as the user would paste it
    assert command[:2] == ["ggpo", "compare"] and "--jobs" in command
    continued = ggpo(*command[1:])
    assert continued.returncode == 0, continued.stderr
    for run in ("grpo-s1", "ggpo-s1"):
        updates = [record["update"] for record in RunFolder(out / "runs" / run).read_metrics()]
        assert updates == sorted(set(updates)) and updates[-1] == 2
        assert f"{run}: done" in continued.stderr.splitlines()
        log = (out / "logs" / f"{run}.log").read_text()  # each job's output, appended to when it runs again
        assert log.startswith("$ ggpo train ") and log.endswith(f"{run}: done\n")
        assert f"{run}: running update 2/2\n" in log

    one = tmp_path / "one"
    done = ggpo("compare", *runs, "--out", str(one))
    assert done.returncode == 0, done.stderr
    for name in ("counts.json", "table.md", "table.csv", "diagnostics.csv"):
        assert (out / name).read_bytes() == (one / name).read_bytes(), name
