"""PoolInfo: the pool footer as one record that writers and readers share; and the run inputs that train and
compare prepare from it."""

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
from ggpo_offline.generate.pipeline import SEED_DERIVATION
from ggpo_offline.pool.info import PoolEngine, PoolInfo, PoolSampling
from ggpo_offline.pool.schema import METADATA_KEY
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.pool.validate import validate_pool
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.pool_index import check_pool, check_sampling, index_pool, pool_fingerprint
from ggpo_offline.train.run_inputs import plan_data, read_inputs


def test_a_generated_pools_info_holds_what_generation_was_given(hf_pool, tiny_dir):
    info = read_pool_info(hf_pool)
    assert info.raw == json.loads(pq.read_metadata(hf_pool).metadata[METADATA_KEY])  # the footer as stored
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
    assert info.prompt_template.kind in ("chat", "plain")
    assert info.prompt_template.kind == info.raw["prompt_template"]["kind"]
    assert info.dataset_spec == "arith:train"
    assert info.schema_version == info.raw["schema_version"] == 1


def test_an_old_pool_without_optional_keys_loads_with_the_defaults(tmp_path):
    meta = synthetic_metadata(4)  # schema_version, sampling.m and model.name only
    info = PoolInfo.from_metadata(meta)
    assert info.sampling == PoolSampling(m=4)
    assert (info.model.name, info.model.path, info.model.location) == ("synthetic", None, None)
    assert (info.tokenizer_sha256, info.dtype, info.prompt_template.kind, info.dataset_spec) == (None,) * 4
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


GENERATE_KEYS = [  # the footer's sections in the order generate-pool has always written them
    *("schema_version", "tool_version", "created", "model", "tokenizer", "engine", "dtype", "sampling"),
    *("dataset", "prompt_template", "reward", "filter", "counts", "config", "generation_seconds", "shard"),
]
IMPORT_KEYS = [  # and import
    *("schema_version", "tool_version", "created", "source", "model", "tokenizer", "engine", "dtype"),
    *("sampling", "dataset", "prompt_template", "reward", "counts", "import"),
]


def _written_footers(monkeypatch) -> list[PoolInfo]:
    """The records `PoolWriter.close` is given from now on."""
    from ggpo_offline.pool.writer import PoolWriter

    given, close = [], PoolWriter.close
    monkeypatch.setattr(
        PoolWriter, "close", lambda writer, info: (given.append(info), close(writer, info))[1]
    )
    return given


def _footer_bytes(pool) -> bytes:
    return pq.ParquetFile(pool).metadata.metadata[METADATA_KEY]


def test_generate_and_import_write_their_footer_through_the_record_and_read_it_back_exactly(
    hf_pool, tiny_dir, tmp_path, monkeypatch
):
    from rollout_formats import write_generic

    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool
    from ggpo_offline.importing.config import ImportConfig
    from ggpo_offline.importing.importer import import_pool

    given = _written_footers(monkeypatch)
    sampling = SamplingSettings(m=2, max_tokens=8, seed=1)
    shard = GenerateConfig(
        num_prompts=4,
        sampling=sampling,
        engine="hf",
        num_shards=2,
        out=tmp_path / "s0.parquet",
        reward_workers=0,
    )
    files = write_generic(hf_pool, tmp_path / "source")
    import_config = ImportConfig(
        format="generic",
        model=str(tiny_dir),
        out=tmp_path / "i.parquet",
        answer_rule="number",
        reward_workers=0,
        check_samples=4,
    )
    pools = [generate_pool(shard), import_pool(import_config, files).path]
    for pool, footer, keys in zip(pools, given, (GENERATE_KEYS, IMPORT_KEYS), strict=True):
        meta = footer.to_metadata()
        assert list(meta) == keys
        assert _footer_bytes(pool) == json.dumps(meta, sort_keys=True).encode()  # what the writer stores
        # The record gives back what it read: the same JSON text (key order included), the same bytes.
        again = PoolInfo.from_metadata(meta).to_metadata()
        assert json.dumps(again) == json.dumps(meta)
        stored = PoolInfo.from_metadata(json.loads(_footer_bytes(pool)))
        assert stored == footer and json.dumps(
            stored.to_metadata(), sort_keys=True
        ).encode() == _footer_bytes(pool)
    generated, imported = (PoolInfo.from_metadata(json.loads(_footer_bytes(pool))) for pool in pools)
    assert (generated.shard.index, generated.shard.count, generated.filter.mixed_only) == (0, 2, False)
    assert generated.sampling.other == {"seed_derivation": SEED_DERIVATION} and generated.sampling.seed == 1
    assert (imported.source, imported.engine.version, imported.sampling.seed) == ("imported", None, None)
    assert imported.raw["engine"] == {"name": "imported:generic", "version": None}  # null, not left out
    assert imported.shard.index is None and imported.imported["format"] == "generic"


def test_older_footers_and_keys_this_version_does_not_know_survive_a_round_trip():
    older = [
        {},
        synthetic_metadata(4),
        {
            "engine": {"name": "hf"},
            "sampling": {"m": 4, "temperature": 0.7},
        },  # no version, no seed: none added
        {"engine": {"name": "x", "version": None}, "sampling": {"m": 2, "seed": None}, "import": {}},
    ]
    for meta in older:
        assert PoolInfo.from_metadata(meta).to_metadata() == meta
    newer = synthetic_metadata(4) | {
        "engine": {"name": "hf", "version": "1", "build": {"cuda": None}},
        "sampling": {"m": 4, "min_p": 0.05},
        "counts": {"groups": 2, "rejected": 1},
        "later_section": [1, None, {"a": 2}],
    }
    info = PoolInfo.from_metadata(newer)
    assert (
        info.to_metadata() == newer
        and info.sampling.m == 4
        and info.engine.other == {"build": {"cuda": None}}
    )
    assert info.other == {"later_section": [1, None, {"a": 2}]} and info.counts.other == {"rejected": 1}
    # A record built by a writer stores a nullable field as null; an empty section is left out.
    assert PoolInfo(engine=PoolEngine(name="x")).to_metadata() == {"engine": {"name": "x", "version": None}}
    assert PoolInfo(engine=PoolEngine()).to_metadata() == PoolInfo().to_metadata() == {}


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
    """compare imports train/run_inputs.py to plan its runs; torch loads only when a run is trained."""
    code = (
        "import sys; import ggpo_offline.compare.comparison, ggpo_offline.train.run_inputs; "
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
