"""Engines: EOS cutting, per-prompt seeds, hf log-probs against a forward pass, and vLLM-written pools."""

import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

from ggpo_offline.core.model_io import eos_token_ids, load_tokenizer
from ggpo_offline.generate.engines import SamplingSettings, prompt_seed
from ggpo_offline.generate.engines.base import cut_at_eos
from ggpo_offline.generate.prompts import encode_prompt, format_prompt
from ggpo_offline.generate.rewards import score_response
from ggpo_offline.pool.schema import POOL_SCHEMA
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.pool.validate import validate_pool


def test_cut_at_eos_keeps_the_first_eos_inclusive():
    assert cut_at_eos([5, 6, 2, 7, 2], [-1.0, -2.0, -3.0, -4.0, -5.0], {2}) == (
        type(cut_at_eos([], [], set()))([5, 6, 2], [-1.0, -2.0, -3.0], "stop")
    )
    cut = cut_at_eos([5, 6, 7], [-1.0, -2.0, -3.0], {2})
    assert (cut.token_ids, cut.finish_reason) == ([5, 6, 7], "length")


def test_prompt_seed_is_stable_and_depends_on_seed_and_prompt():
    assert prompt_seed(0, "a") == prompt_seed(0, "a")
    seeds = {prompt_seed(s, p) for s in range(3) for p in "abcdefgh"}
    assert len(seeds) == 24 and all(0 <= s < 2**62 for s in seeds)


def _prompts(tiny_dir, questions):
    tokenizer = load_tokenizer(tiny_dir)
    return tokenizer, [
        encode_prompt(tokenizer, format_prompt(tokenizer, q, "plain"), "plain") for q in questions
    ]


def _forward_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Token log-probs of ``response`` under a plain float32 forward pass over prompt + response."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.fixture(scope="module")
def hf_engine(tiny_dir):
    from ggpo_offline.generate.engines.hf_engine import HfEngine

    return HfEngine(tiny_dir, dtype="float32")


def test_hf_engine_logprobs_are_the_sampled_tokens_logprobs(hf_engine, tiny_dir):
    _, prompts = _prompts(tiny_dir, ["What is 3 + 4?", "What is 12 * 3 - 5?"])
    sampling = SamplingSettings(m=3, max_tokens=40, seed=1)
    groups = hf_engine.generate(prompts, [11, 12], sampling)
    eos = eos_token_ids(tiny_dir)
    for prompt, group in zip(prompts, groups, strict=True):
        assert len(group) == 3
        for sample in group:
            assert len(sample.token_ids) == len(sample.logprobs) <= 40
            if sample.finish_reason == "stop":
                assert sample.token_ids[-1] in eos and not set(sample.token_ids[:-1]) & eos
            else:
                assert len(sample.token_ids) == 40 and not set(sample.token_ids) & eos
            expected = _forward_logprobs(hf_engine.model, prompt, sample.token_ids)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-5, rtol=0)


def test_hf_engine_samples_depend_only_on_the_prompt_seed(hf_engine, tiny_dir):
    _, prompts = _prompts(tiny_dir, ["What is 3 + 4?", "What is 8 + 9?"])
    sampling = SamplingSettings(m=4, max_tokens=32)
    first = hf_engine.generate(prompts, [5, 6], sampling)
    swapped = hf_engine.generate(prompts[::-1], [6, 5], sampling)
    assert first == swapped[::-1]
    assert hf_engine.generate(prompts[:1], [99], sampling) != first[:1]


@pytest.mark.vllm
def test_vllm_pool_is_valid_and_readable_without_this_package(vllm_pool, tiny_dir):
    report = validate_pool(vllm_pool)
    assert (report.groups, report.group_size, report.rows) == (40, 8, 320)
    table = pq.read_table(vllm_pool)
    assert table.schema.equals(POOL_SCHEMA, check_metadata=False)
    frame = pl.read_parquet(vllm_pool)
    assert frame.height == 320
    assert frame.group_by("group_id").len()["len"].to_list() == [8] * 40
    lengths_equal = frame.select(
        (pl.col("response_token_ids").list.len() == pl.col("behavior_logprobs").list.len()).all()
    ).item()
    assert lengths_equal
    meta = read_pool_info(vllm_pool).raw
    assert meta["engine"]["name"] == "vllm" and meta["sampling"]["logprobs_mode"] == "processed_logprobs"
    assert meta["counts"]["responses"] == 320 and meta["counts"]["groups"] == 40
    assert meta["counts"]["mean_reward"] == pytest.approx(frame["reward"].mean(), abs=1e-6)
    eos = eos_token_ids(tiny_dir)
    for tokens, reason in zip(
        frame["response_token_ids"].to_list(), frame["finish_reason"].to_list(), strict=True
    ):
        if reason == "stop":
            assert tokens[-1] in eos and not set(tokens[:-1]) & eos
        else:
            assert len(tokens) == 64 and not set(tokens) & eos


@pytest.mark.vllm
def test_vllm_pool_rewards_equal_a_fresh_score_under_the_number_rule(vllm_pool):
    frame = pl.read_parquet(vllm_pool)
    for response, answer, reward, extracted in frame.select(
        "response", "answer", "reward", "extracted_answer"
    ).iter_rows():
        fresh = score_response(response, answer, rule="number")  # arith: answer rule auto = number
        assert (fresh.reward, fresh.extracted_answer) == (reward, extracted)
    assert 0 < frame["reward"].mean() < 1  # the tiny model is neither hopeless nor perfect
    reward_meta = read_pool_info(vllm_pool).raw["reward"]
    assert (reward_meta["timeouts"], reward_meta["errors"]) == (0, 0)


@pytest.mark.vllm
def test_vllm_logprobs_track_a_float32_forward_pass(vllm_pool, tiny_dir):
    """bf16 sampling vs fp32 recomputation: small drift, and no off-by-one in the token alignment."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    frame = pl.read_parquet(vllm_pool).head(24)
    diffs = []
    for prompt, tokens, logprobs in frame.select(
        "prompt_token_ids", "response_token_ids", "behavior_logprobs"
    ).iter_rows():
        expected = _forward_logprobs(model, prompt, tokens)
        diffs.append((torch.tensor(logprobs) - expected).abs())
    drift = torch.cat(diffs)
    assert drift.mean() < 0.05 and drift.max() < 1.0


@pytest.mark.vllm
def test_vllm_same_seed_same_pool(vllm_pool, vllm_engine, tmp_path):
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    config = GenerateConfig(
        num_prompts=40,
        sampling=SamplingSettings(m=8, max_tokens=64, seed=7),
        out=tmp_path / "again.parquet",
        reward_workers=0,
        batch_prompts=16,
    )
    again = generate_pool(config, engine=vllm_engine)
    assert pq.read_table(again).equals(pq.read_table(vllm_pool))
    other = generate_pool(
        GenerateConfig(
            num_prompts=40,
            sampling=SamplingSettings(m=8, max_tokens=64, seed=8),
            out=tmp_path / "other.parquet",
            reward_workers=0,
            batch_prompts=16,
        ),
        engine=vllm_engine,
    )
    assert not pq.read_table(other).equals(pq.read_table(vllm_pool))


@pytest.mark.vllm
def test_mixed_only_keeps_only_groups_with_some_right_and_some_wrong(vllm_pool, vllm_engine, tmp_path):
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    config = GenerateConfig(
        num_prompts=40,
        sampling=SamplingSettings(m=8, max_tokens=64, seed=7),
        out=tmp_path / "mixed.parquet",
        reward_workers=0,
        batch_prompts=16,
        mixed_only=True,
    )
    mixed = pl.read_parquet(generate_pool(config, engine=vllm_engine))
    full = pl.read_parquet(vllm_pool)
    sums = full.group_by("group_id").agg(pl.col("reward").sum())
    expected = sorted(sums.filter((pl.col("reward") > 0) & (pl.col("reward") < 8))["group_id"].to_list())
    assert sorted(mixed["group_id"].unique().to_list()) == expected
    assert mixed.equals(full.filter(pl.col("group_id").is_in(expected)))
    assert read_pool_info(config.out).raw["counts"]["groups"] == len(expected)


def test_hf_same_seed_same_pool(tmp_path):
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    def pool(name: str, seed: int):
        config = GenerateConfig(
            num_prompts=4,
            sampling=SamplingSettings(m=2, max_tokens=32, seed=seed),
            engine="hf",
            dtype="float32",
            out=tmp_path / name,
            reward_workers=0,
        )
        return pq.read_table(generate_pool(config))

    first = pool("a.parquet", seed=5)
    assert first.equals(pool("b.parquet", seed=5))
    assert not first.equals(pool("c.parquet", seed=6))
