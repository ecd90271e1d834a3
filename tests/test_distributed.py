"""Training in several processes (torchrun's launcher; DDP or FSDP2 over gloo) equals the single-process
run."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.trainer import train

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


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_two_gloo_processes_give_the_one_process_updates_metrics_and_weights(
    vllm_pool, one_process, tmp_path, wrapper
):
    one = one_process
    two = replace(_config(vllm_pool, tmp_path / "two"), threads=1, fsdp=wrapper == "fsdp")  # a core each
    command = [GGPO, "train", "--nproc", "2", *_flags(two), *(["--fsdp"] if two.fsdp else [])]
    done = subprocess.run(command, capture_output=True, text=True)
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


def test_job_size_errors_are_one_line_before_or_from_the_workers(vllm_pool, tmp_path):
    config = TrainConfig(
        pool=vllm_pool, updates=2, groups_per_batch=3, lr=1e-4, ref_refresh=2, micro_batch_size=8,
        save_every=1, no_tracking=True, out=tmp_path / "run",
    )  # fmt: skip
    done = subprocess.run([GGPO, "train", "--nproc", "2", *_flags(config)], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: --groups-per-batch 3 does not split evenly over 2 processes; "
        "choose G divisible by the number of processes"
    ]
    train(replace(config, groups_per_batch=2, updates=1))  # one process, checkpoint at update 1
    done = subprocess.run(
        [GGPO, "train", "--nproc", "2", "--resume", *_flags(replace(config, groups_per_batch=2, updates=1))],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: --resume: {config.out} was trained by 1 process(es); resume it with the same number (now 2)"
    )


FSDP_BF16_CHECK = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)  # no port
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM
from ggpo_offline.core.model_io import tiny_model_dir
from ggpo_offline.train.batch import MinibatchReader
from ggpo_offline.train.distributed import cast_parameters
from ggpo_offline.train.logprobs import ResponseLogprobs
from ggpo_offline.train.plan import index_pool
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
