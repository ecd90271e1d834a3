"""Shared fixtures: synthetic pools, the shipped tiny model, one vLLM engine and one Slurm per session."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from ggpo_offline.evaluate.eval_report import EvalSettings, EvaluatedModel
from ggpo_offline.generate.engines.base import SamplingSettings
from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.pool.schema import SCHEMA_VERSION
from ggpo_offline.pool.writer import PoolWriter

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_file(name: str) -> Path:
    """A real benchmark file from ../shared/data, or skip the test saying why."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"real benchmark file {path} is absent (expected in ../shared/data beside the repo)")
    return path


def synthetic_rows(groups: int, m: int, seed: int = 0) -> list[dict]:
    """Valid pool rows with random tokens, log-probs <= 0 and binary rewards."""
    rng = random.Random(seed)
    rows = []
    for group_id in range(groups):
        for sample_idx in range(m):
            length = rng.randint(1, 12)
            rows.append(
                {
                    "group_id": group_id,
                    "sample_idx": sample_idx,
                    "prompt_id": f"p{group_id}",
                    "source": "synthetic",
                    "prompt": f"What is {group_id} + 1?",
                    "prompt_token_ids": [1, 5, 6, 7],
                    "answer": str(group_id + 1),
                    "response": "x" * length,
                    "response_token_ids": [rng.randint(4, 99) for _ in range(length)],
                    "behavior_logprobs": [-rng.random() * 3 for _ in range(length)],
                    "finish_reason": rng.choice(["stop", "length"]),
                    "reward": float(rng.random() < 0.5),
                    "extracted_answer": None,
                }
            )
    return rows


def synthetic_metadata(m: int) -> dict:
    return {"schema_version": SCHEMA_VERSION, "sampling": {"m": m}, "model": {"name": "synthetic"}}


def synthetic_footer(m: int) -> PoolInfo:
    return PoolInfo.from_metadata(synthetic_metadata(m))


def write_synthetic_pool(
    path: Path,
    groups: int = 6,
    m: int = 4,
    rows: list[dict] | None = None,
    metadata: dict | None = None,
    rows_per_group_chunk: int | None = None,
) -> Path:
    """Write a pool through the real writer, optionally in several row groups."""
    rows = synthetic_rows(groups, m) if rows is None else rows
    chunk = rows_per_group_chunk or len(rows)
    with PoolWriter(path, overwrite=True) as writer:
        for start in range(0, len(rows), chunk):
            writer.write_rows(rows[start : start + chunk])
        writer.close(PoolInfo.from_metadata(synthetic_metadata(m) if metadata is None else metadata))
    return path


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from ggpo_offline.core.model_io import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture(scope="session")
def vllm_engine(tiny_dir):
    """The vLLM engine on the tiny model, started once for the whole session (it takes ~15 s here)."""
    from ggpo_offline.generate.engines import load_engine

    engine = load_engine("vllm", tiny_dir, dtype="auto", max_model_len=512, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_pool(tmp_path_factory, vllm_engine) -> Path:
    """A small pool written by the vLLM engine from the embedded default (arith train split)."""
    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    out = tmp_path_factory.mktemp("vllm") / "pool.parquet"
    config = GenerateConfig(
        num_prompts=40,
        sampling=SamplingSettings(m=8, max_tokens=64, seed=7),
        out=out,
        reward_workers=2,
        batch_prompts=16,
    )
    return generate_pool(config, engine=vllm_engine)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist's loadgroup (make test), every test on the session's vLLM engine runs in one
    # worker: one engine start instead of one per worker.
    # Likewise every test on the session's Slurm cluster: one worker starts its daemons.
    for item in items:
        if "vllm_engine" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real one-node Slurm on this machine for the session (tests/slurm_cluster.py), named by SLURM_CONF
    in this process's environment, stopped at the end; skipped, saying why, where it cannot start."""
    from slurm_cluster import running_cluster, why_no_slurm

    why = why_no_slurm()
    if why is not None:
        pytest.skip(why)
    saved = os.environ.get("SLURM_CONF")
    with running_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        os.environ["SLURM_CONF"] = str(cluster.conf)
        try:
            yield cluster
        finally:
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved


def hf_pool_config(out: Path, **changes):
    """The settings of `hf_pool` (16 prompts, m 4, every group kept), written to ``out``, with ``changes``."""
    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig

    settings = {
        "num_prompts": 16,
        "sampling": SamplingSettings(m=4, max_tokens=64, seed=3),
        "engine": "hf",
        "dtype": "float32",
        "out": out,
        "reward_workers": 0,
    }
    return GenerateConfig(**(settings | changes))


@pytest.fixture(scope="session")
def hf_pool(tmp_path_factory) -> Path:
    """A small float32 pool written by the hf engine: the trainer's numerics reproduce its log-probs."""
    from ggpo_offline.generate.pipeline import generate_pool

    return generate_pool(hf_pool_config(tmp_path_factory.mktemp("hf") / "pool.parquet"))


def build_rehearsal_in_new_process(out: Path, seed: int) -> Path:
    """The rehearsal model built in a new process, as `ggpo build-rehearsal-model` builds it: a worker that
    has started the session's vLLM engine cannot set torch's threads (the builder refuses there)."""
    code = "import sys; from ggpo_offline.organism.rehearsal import build_rehearsal_model as build; "
    code += "build(sys.argv[1], int(sys.argv[2]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out), str(seed)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="session")
def rehearsal_dir(tmp_path_factory) -> Path:
    """The rehearsal model (a small Qwen3 with a byte-level BPE and a chat template), built once (seed 0)."""
    return build_rehearsal_in_new_process(tmp_path_factory.mktemp("rehearsal") / "model", seed=0)


@pytest.fixture(scope="session")
def other_rehearsal_dir(tmp_path_factory) -> Path:
    """The rehearsal model built from seed 1: the same tokenizer, other weights (another model's rollouts)."""
    return build_rehearsal_in_new_process(tmp_path_factory.mktemp("rehearsal-seed-1") / "model", seed=1)


@pytest.fixture(scope="session")
def rehearsal_pool(tmp_path_factory, rehearsal_dir) -> Path:
    """A float32 hf pool of the rehearsal model with its chat template: 16 prompts x 16 responses of at most
    32 tokens (m = 16: the random model is right only by chance, so groups of 16 are mixed often enough)."""
    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    config = GenerateConfig(
        model=str(rehearsal_dir),
        template="chat",
        num_prompts=16,
        sampling=SamplingSettings(m=16, max_tokens=32, seed=0),
        engine="hf",
        dtype="float32",
        out=tmp_path_factory.mktemp("rehearsal-pool") / "pool.parquet",
        reward_workers=0,
    )
    return generate_pool(config)


POOL_PASSES = (
    ("ggpo_offline.pool.validate", "validate_pool"),
    ("ggpo_offline.train.pool_index", "index_pool"),
    ("ggpo_offline.train.pool_index", "pool_fingerprint"),
    ("ggpo_offline.pool.inspect", "pool_summary"),
)
"""Functions that each read through a pool (or its footer): a command calls each at most once."""


def count_pool_passes(monkeypatch) -> dict[str, int]:
    """Count calls of each `POOL_PASSES` function from now on, wherever a module imported it by name."""
    import importlib
    import sys

    calls = {name: 0 for _, name in POOL_PASSES}
    for module_name, name in POOL_PASSES:
        original = getattr(importlib.import_module(module_name), name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        for module in list(sys.modules.values()):
            if (
                getattr(module, "__name__", "").startswith("ggpo_offline")
                and getattr(module, name, None) is original
            ):
                monkeypatch.setattr(module, name, counted)
    return calls


def read_metric_series(tracking_uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric of an MLflow run as its full (step, value) history, sorted by step (then value)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    keys = client.get_run(run_id).data.metrics.keys()
    return {
        key: sorted((point.step, point.value) for point in client.get_metric_history(run_id, key))
        for key in keys
    }


def stopped_itself(job: subprocess.Popen, log: Path) -> None:
    """Wait until ``job`` stopped itself at its GGPO_STOP_AT point: a moment fixed by the run, not by load."""
    import time

    import psutil

    process = psutil.Process(job.pid)
    while process.status() != psutil.STATUS_STOPPED:
        if job.poll() is not None:
            pytest.fail(f"the run ended (exit code {job.returncode}) before it stopped: {log.read_text()}")
        time.sleep(0.05)


def eval_settings() -> EvalSettings:
    """The settings of an evaluation report that tests build from counts alone."""
    model = EvaluatedModel("tiny_model", "embedded:tiny", "0" * 64)
    engine = {"name": "hf", "version": "0"}
    return EvalSettings(model, SamplingSettings(), None, engine, "float32", {}, 0, "0.1.0")
