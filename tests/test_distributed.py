"""Training in several processes (torchrun's launcher; DDP or FSDP2 over gloo) equals the single-process
run."""

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import STOP_VARIABLE
from ggpo_offline.train.evaluation import eval_config
from ggpo_offline.train.trainer import train
from ggpo_offline.train.training_presets import resolve_config

GGPO = str(Path(sys.executable).parent / "ggpo")


def _flags(config: TrainConfig) -> list[str]:
    return [
        "--pool", str(config.pool), "--method", config.method, "--updates", str(config.updates),
        "--groups-per-batch", str(config.groups_per_batch), "--lr", str(config.lr),
        "--ref-refresh", str(config.ref_refresh), "--micro-batch-size", str(config.micro_batch_size),
        "--save-every", str(config.save_every), "--no-tracking", "--out", str(config.out),
        *(["--threads", str(config.threads)] if config.threads else []),
    ]  # fmt: skip


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _config(pool: Path, out: Path) -> TrainConfig:
    # 2 groups per rank in micro-batches of one group (gradient accumulation without sync, then one
    # reduction), and a reference refresh at update 2 (the scheduled anchor pass runs on each rank's share).
    return TrainConfig(
        pool=pool, method="ggpo", updates=4, groups_per_batch=4, lr=1e-4, ref_refresh=2,
        micro_batch_size=8, save_every=2, no_tracking=True, out=out,
    )  # fmt: skip


@pytest.fixture(scope="module")
def one_process(vllm_pool, tmp_path_factory):
    return train(_config(vllm_pool, tmp_path_factory.mktemp("one") / "run"))


def _two_processes(config: TrainConfig) -> list[str]:
    return [GGPO, "train", "--nproc", "2", *_flags(config), *(["--fsdp"] if config.fsdp else [])]


@pytest.fixture(scope="module")
def two_ddp_processes(vllm_pool, tmp_path_factory) -> TrainConfig:
    """The two-process DDP run of `_config`, uninterrupted."""
    two = replace(_config(vllm_pool, tmp_path_factory.mktemp("two") / "run"), threads=1)  # a core each
    done = subprocess.run(_two_processes(two), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return two


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_two_gloo_processes_give_the_one_process_updates_metrics_and_weights(
    vllm_pool, one_process, two_ddp_processes, tmp_path, wrapper
):
    one = one_process
    two = two_ddp_processes
    if wrapper == "fsdp":
        two = replace(_config(vllm_pool, tmp_path / "two"), threads=1, fsdp=True)
        done = subprocess.run(_two_processes(two), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]

    series_one, series_two = _metrics(one.run_dir), _metrics(two.out)
    assert [r["update"] for r in series_two] == [0, 1, 2, 3]
    for a, b in zip(series_one, series_two, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["update"], key, a[key], b[key])
    weights_one = load_file(str(one.final_model / "model.safetensors"))
    weights_two = load_file(str(two.out / "final" / "model.safetensors"))
    assert weights_one.keys() == weights_two.keys()
    for name in weights_one:
        torch.testing.assert_close(weights_two[name], weights_one[name], atol=1e-5, rtol=0)
    assert not torch.equal(
        weights_one["model.norm.weight"],
        load_file(str(one.run_dir / "checkpoints" / "update-000002" / "model.safetensors"))[
            "model.norm.weight"
        ],
    )  # fmt: skip  (the weights did move, so the equality above says something)
    # each rank kept its own share of the anchor windows for --resume
    assert sorted(p.name for p in (two.out / "checkpoints" / "update-000002").glob("rank-*.pt")) == [
        "rank-000.pt", "rank-001.pt",
    ]  # fmt: skip


def test_compare_trains_each_run_with_torchrun_as_one_process_does(vllm_pool, one_process, tmp_path):
    """`ggpo compare --nproc 2`: each run's job is a torchrun of two gloo processes, whose updates and
    weights equal the one-process run's (as above); its evaluations use the hf engine to keep this short."""
    flags = _flags(_config(vllm_pool, tmp_path))
    flags = [f for f in flags[: flags.index("--out")] if f not in ("--method", "ggpo")]
    evaluation = ["--eval-engine", "hf", "--eval-every", "4", "--eval-n", "2", "--eval-num-problems", "4",
                  "--no-test", "--threads", "1"]  # fmt: skip
    command = [GGPO, "compare", "--methods", "ggpo", "--seeds", "42", "--nproc", "2", *flags, *evaluation]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "r" / "runs" / "ggpo-s42"
    series_one, series_two = _training_records(one_process.run_dir), _training_records(run)
    assert [r["update"] for r in series_two] == [0, 1, 2, 3]
    for a, b in zip(series_one, series_two, strict=True):
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["update"], key, a[key], b[key])
    assert sorted(p.name for p in (run / "checkpoints" / "update-000002").glob("rank-*.pt")) == [
        "rank-000.pt",
        "rank-001.pt",
    ]  # fmt: skip  (trained by two processes)


def _counts(folder: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text())["benchmarks"] for p in sorted(folder.glob("*.json"))}


def test_two_processes_evaluate_with_vllm_as_one_process_does(vllm_pool, vllm_engine, tiny_dir, tmp_path):
    """The tiny preset evaluates with vLLM from update 0. Started inside a torchrun worker, the engine
    joined the training job's process group and the job hung forever; now it finishes, and its validation
    and test reports hold the one-process run's counts (smaller benchmarks than the preset's, to fit here)."""
    sizes = {"eval_num_problems": 16, "test_num_problems": 16}
    one = resolve_config("tiny", None, pool=vllm_pool, updates=2, groups_per_batch=4, no_tracking=True,
                         out=tmp_path / "one", **sizes)  # fmt: skip
    with Evaluator(eval_config(one, tiny_dir), engine=vllm_engine) as shared:
        train(one, evaluator=shared)
    command = [
        GGPO, "train", "--nproc", "2", "--preset", "tiny", "--pool", str(vllm_pool), "--updates", "2",
        "--groups-per-batch", "4", "--eval-num-problems", "16", "--test-num-problems", "16", "--no-tracking",
        "--threads", "1", "--wait-timeout", "900", "--out", str(tmp_path / "two"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    validation = _counts(tmp_path / "two" / "eval")
    assert list(validation) == ["update-000000.json", "update-000002.json"]
    assert validation == _counts(tmp_path / "one" / "eval")
    assert _counts(tmp_path / "two" / "eval" / "test") == _counts(tmp_path / "one" / "eval" / "test")


def _stopped_worker(job: subprocess.Popen) -> psutil.Process:
    """The worker (a child of the launcher ``job``) that stopped itself at its GGPO_STOP_AT point
    (`ggpo_offline.train.distributed.stop_when_asked`): a moment fixed by the run, not by the machine's
    load."""
    while job.poll() is None:
        for worker in psutil.Process(job.pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if worker.status() == psutil.STATUS_STOPPED:
                    return worker
        time.sleep(0.05)
    pytest.fail(f"the job ended (exit code {job.returncode}) before a worker stopped")


def _stopped_at(command: list[str], stop_at: str) -> tuple[subprocess.Popen, psutil.Process]:
    job = subprocess.Popen(
        command, env={**os.environ, STOP_VARIABLE: stop_at}, stderr=subprocess.PIPE, text=True
    )
    return job, _stopped_worker(job)


def _error_lines(job: subprocess.Popen) -> list[str]:
    stderr = job.communicate()[1]
    assert job.returncode == 1 and "Traceback" not in stderr
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def _training_records(run: Path) -> list[dict]:
    """metrics.jsonl without what evaluated checkpoints log (scores, generated text, drift from π0), and
    without the record of the final evaluation alone."""
    records = [{k: v for k, v in r.items() if not k.startswith(("eval/", "probe/"))} for r in _metrics(run)]
    return [record for record in records if record.keys() != {"update"}]


def test_killed_processes_are_one_line_each_and_resume_gives_the_uninterrupted_run(
    two_ddp_processes, tmp_path
):
    """kill -9 of process 1 at its update 3, then, resumed, of the evaluation process while process 0 waits
    for it at update 4: each time one line says which process, how it ended, what it was doing and where
    --resume continues; the resumed updates' metrics and weights are the uninterrupted run's (evaluated in
    another process, they do not depend on it), bit for bit. (Resuming past a killed evaluation: make
    chaos.)"""
    config = replace(two_ddp_processes, out=tmp_path / "run")
    command = [
        *_two_processes(config), "--eval-every", "2", "--eval-engine", "hf", "--eval-n", "2",
        "--eval-num-problems", "4", "--no-test",
    ]  # fmt: skip
    job, worker = _stopped_at(command, "1:training update 3")
    worker.kill()
    checkpoint = config.out / "checkpoints" / "update-000002"
    assert _error_lines(job) == [
        "error: training process 1 was killed by signal 9 (SIGKILL) while training update 3; the same "
        f"command with --resume continues from update 2 ({checkpoint})"
    ]

    job, rank_zero = _stopped_at([*command, "--resume"], "0:evaluating update 4")
    (engine,) = [p for p in rank_zero.children() if "spawn_main" in " ".join(p.cmdline())]
    engine.kill()
    while engine.status() != psutil.STATUS_ZOMBIE:  # dead; its stopped parent has not reaped it yet
        time.sleep(0.05)
    rank_zero.resume()
    checkpoint = config.out / "checkpoints" / "update-000004"
    assert _error_lines(job) == [
        f"error: the evaluation engine (process {engine.pid}) was killed by signal 9 (SIGKILL) while "
        f"evaluating update-000004; the same command with --resume continues from update 4 ({checkpoint})"
    ]

    # Resumed from update 2, updates 2 and 3 were trained again: bit for bit the uninterrupted ones.
    assert _training_records(config.out) == _metrics(two_ddp_processes.out)
    weights = "checkpoints/update-000004/model.safetensors"
    trained, expected = load_file(str(config.out / weights)), load_file(str(two_ddp_processes.out / weights))
    assert all(torch.equal(trained[name], expected[name]) for name in expected)


def test_job_size_errors_are_one_line_before_any_worker_starts(vllm_pool, tmp_path, monkeypatch):
    import torch.distributed.launcher.api as launcher_api
    from test_cli import ggpo_here

    def no_workers(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(launcher_api, "elastic_launch", no_workers)
    config = TrainConfig(
        pool=vllm_pool, updates=2, groups_per_batch=3, lr=1e-4, ref_refresh=2, micro_batch_size=8,
        save_every=1, no_tracking=True, out=tmp_path / "run",
    )  # fmt: skip
    done = ggpo_here("train", "--nproc", "2", *_flags(config))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: --groups-per-batch 3 does not split evenly over 2 processes; "
        "choose G divisible by the number of processes"
    ]
    train(replace(config, groups_per_batch=2, updates=1))  # one process, checkpoint at update 1
    done = ggpo_here(
        "train", "--nproc", "2", "--resume", *_flags(replace(config, groups_per_batch=2, updates=1))
    )
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"error: --resume: {config.out} was trained by 1 process(es); resume it with the same number (now 2)"
    ]


FSDP_BF16_CHECK = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)  # no port
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM
from ggpo_offline.core.model_io import tiny_model_dir
from ggpo_offline.train.minibatch import MinibatchReader
from ggpo_offline.train.distributed import cast_parameters
from ggpo_offline.train.logprobs import ResponseLogprobs
from ggpo_offline.train.pool_index import index_pool
index = index_pool(sys.argv[1])
batch = MinibatchReader(sys.argv[1], index, 0).read(index.mixed_group_ids[:4].tolist())
def model():
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()), dtype=torch.float32)
sharded = ResponseLogprobs(model(), 0.7)
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)  # wrap()'s on CUDA
for layer in sharded.model.model.layers:
    fully_shard(layer, mp_policy=policy)
fully_shard(sharded, mp_policy=policy)
with torch.no_grad():
    learner = sharded(batch)[0]
    cast = ResponseLogprobs(cast_parameters(model(), torch.bfloat16), 0.7)(batch)[0]
    fp32 = ResponseLogprobs(model(), 0.7)(batch)[0]
print(torch.equal(learner, cast), (learner - fp32).abs().max().item())
"""


def test_pi0_scored_with_cast_parameters_equals_the_fsdp2_bf16_learner(vllm_pool, tmp_path):
    """Under --fsdp on CUDA the learner computes with bf16 parameters; π0 is scored with the parameters cast
    the same way (`cast_parameters`). FSDP2's bf16 policy runs on CPU too, so the equality is checked here:
    exact, while fp32 weights would bias every update-0 s − s_ref."""
    done = subprocess.run(
        [sys.executable, "-c", FSDP_BF16_CHECK, str(vllm_pool), str(tmp_path / "rendezvous")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    equal, fp32_gap = done.stdout.split()[-2:]
    assert equal == "True" and float(fp32_gap) > 1e-3
