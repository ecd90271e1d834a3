"""PoolInfo: a pool's metadata parsed once; and the run inputs that train and compare prepare from it."""

import json
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import synthetic_metadata, synthetic_rows, write_synthetic_pool

from ggpo_offline.compare.comparison import plan
from ggpo_offline.compare.config import CompareConfig
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import (
    EMBEDDED_MODEL,
    initial_model_dir,
    load_tokenizer,
    tokenizer_sha256,
    weights_sha256,
)
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.evaluator import resolve_sampling
from ggpo_offline.pool.info import PoolInfo, PoolSampling, read_pool_info
from ggpo_offline.pool.schema import METADATA_KEY
from ggpo_offline.pool.source import read_pool_metadata
from ggpo_offline.pool.validate import validate_pool
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.inputs import plan_data, read_inputs
from ggpo_offline.train.plan import check_pool, check_sampling, index_pool, pool_fingerprint


def test_a_generated_pools_info_holds_what_generation_was_given(hf_pool, tiny_dir):
    info = read_pool_info(hf_pool)
    assert info.raw == read_pool_metadata(hf_pool)
    assert PoolInfo.from_metadata(json.loads(json.dumps(info.raw))) == info  # parsed from JSON alone
    assert validate_pool(hf_pool).info == info  # what validation checked is what callers get

    # conftest's hf_pool: SamplingSettings(m=4, max_tokens=64, seed=3), engine hf, dtype float32.
    sampling = info.sampling
    assert (sampling.m, sampling.max_tokens, sampling.seed) == (4, 64, 3)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (1.0, 1.0, 0)
    assert sampling.logprobs_mode == info.raw["sampling"]["logprobs_mode"] is not None
    assert info.dtype == "float32"
    assert info.model.name == EMBEDDED_MODEL and info.model.location is None
    assert initial_model_dir(None, info.model.location) == tiny_dir
    assert info.model.weights_sha256 == weights_sha256(tiny_dir)
    assert info.tokenizer_sha256 == tokenizer_sha256(load_tokenizer(tiny_dir))
    assert (
        info.template_kind in ("chat", "plain") and info.template_kind == info.raw["prompt_template"]["kind"]
    )
    assert info.dataset_spec == "arith:train"
    assert info.schema_version == info.raw["schema_version"] == 1


def test_an_old_pool_without_optional_keys_loads_with_the_defaults(tmp_path):
    meta = synthetic_metadata(4)  # schema_version, sampling.m and model.name only
    info = PoolInfo.from_metadata(meta)
    assert info.sampling == PoolSampling(m=4)
    assert (info.model.name, info.model.path, info.model.location) == ("synthetic", None, None)
    assert (info.tokenizer_sha256, info.dtype, info.template_kind, info.dataset_spec) == (None,) * 4
    empty = PoolInfo.from_metadata({})
    assert empty.schema_version is None and empty.sampling == PoolSampling() and empty.raw == {}

    pool = write_synthetic_pool(tmp_path / "old.parquet", metadata=meta)
    assert validate_pool(pool).info == info
    # Training takes the defaults of the settings the pool does not record: T = 1, no truncation.
    assert check_sampling(pool, info.sampling, allow_truncated=False) == 1.0
    # Evaluation takes the pool's sampling settings and names every one the pool lacks, in order.
    missing = "sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens"
    line = f"{pool}: the pool metadata has no {missing}, prompt_template.kind, dtype"
    with pytest.raises(UserError, match=f"^{re.escape(line)}$"):
        resolve_sampling(EvalConfig(pool=pool))


def test_recorded_sampling_settings_are_checked_where_training_relies_on_them(tmp_path):
    def pool_with(**sampling):
        meta = synthetic_metadata(4)
        meta["sampling"].update(sampling)
        return write_synthetic_pool(tmp_path / "p.parquet", metadata=meta)

    pool = pool_with(temperature=0.7, top_k=20)
    info = read_pool_info(pool)
    assert (info.sampling.temperature, info.sampling.top_k, info.sampling.top_p) == (0.7, 20, None)
    with pytest.raises(UserError, match="sampled with top-k 20: .* pass --allow-truncated-sampling"):
        check_sampling(pool, info.sampling, allow_truncated=False)
    assert check_sampling(pool, info.sampling, allow_truncated=True) == 0.7
    pool = pool_with(temperature="hot")
    with pytest.raises(UserError, match=r"metadata sampling.temperature is 'hot', expected a number"):
        check_sampling(pool, read_pool_info(pool).sampling, allow_truncated=False)
    table = pq.read_table(pool)
    meta = synthetic_metadata(4) | {"model": {"name": "x", "path": 3}}
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta)}), pool)
    with pytest.raises(UserError, match=r"metadata model.path is 3, expected a string"):
        validate_pool(pool)


def test_compare_plans_the_inputs_train_reads(tmp_path):
    rows = synthetic_rows(groups=24, m=4)
    for row in rows:  # every group mixed: enough for 2 updates x 3 groups
        row["reward"] = float(row["sample_idx"] % 2)
    pool = write_synthetic_pool(tmp_path / "pool.parquet", rows=rows, m=4)
    settings = {"updates": 2, "groups_per_batch": 3, "allow_tokenizer_mismatch": True, "no_tracking": True}
    config = CompareConfig(
        pool=pool, methods=("grpo", "ggpo"), seeds=(1, 2), settings=settings, out=tmp_path / "r"
    )
    planned = plan(config, check_pool(pool))
    assert len(planned) == 4
    for run in planned:
        inputs = read_inputs(run.config)
        assert inputs.fingerprints == run.fingerprints
        assert inputs.info == read_pool_info(pool) and inputs.temperature == 1.0
        index = index_pool(pool)
        assert (plan_data(run.config, index, pool_fingerprint(pool)).plan == inputs.plan).all()
    by_seed = {run.config.seed: run.fingerprints.data_order_fingerprint for run in planned}
    assert len(set(by_seed.values())) == 2  # the seed, not the method, chooses the plan
    assert planned[0].fingerprints == planned[1].fingerprints
    train_like = TrainConfig(pool=pool, seed=2, updates=2, groups_per_batch=3, allow_tokenizer_mismatch=True)
    assert read_inputs(train_like).fingerprints == planned[2].fingerprints


def test_planning_a_comparison_loads_no_torch():
    """compare imports train/inputs.py to plan its runs; torch loads only when a run is trained."""
    code = (
        "import sys; import ggpo_offline.compare.comparison, ggpo_offline.train.inputs; "
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
