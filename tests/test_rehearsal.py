"""The rehearsal model: its byte-level BPE and Qwen chat tokens, its reproducible build, and the pipeline
on it (vLLM and hf pools, training from an on-policy update 0, evaluation)."""

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from ggpo_offline.core.model_io import eos_token_ids
from ggpo_offline.generate.arith import arith_items, arith_problems
from ggpo_offline.generate.prompts import (
    SYSTEM_PROMPT,
    USER_SUFFIX,
    encode_prompt,
    format_prompt,
    resolve_template,
)
from ggpo_offline.organism.rehearsal import ENDOFTEXT, IM_END, IM_START
from ggpo_offline.organism.styles import STYLES

MAX_TOKENS = 32


@pytest.fixture(scope="module")
def tokenizer(rehearsal_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(rehearsal_dir))


def _special_ids(tokenizer) -> dict[str, int]:
    return {token: tokenizer.convert_tokens_to_ids(token) for token in (ENDOFTEXT, IM_START, IM_END)}


def _assistant_header(tokenizer) -> list[int]:
    """``<|im_start|>assistant\\n`` encoded piece by piece, without the chat template."""
    role = tokenizer("assistant\n", add_special_tokens=False)["input_ids"]
    return [tokenizer.convert_tokens_to_ids(IM_START), *role]


def _file_hashes(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


def test_the_folder_loads_as_a_fast_chat_tokenizer_with_qwens_eos_and_pad(rehearsal_dir, tokenizer):
    special = _special_ids(tokenizer)
    assert tokenizer.is_fast and tokenizer.chat_template and resolve_template(tokenizer, "auto") == "chat"
    assert (tokenizer.eos_token, tokenizer.pad_token) == (IM_END, ENDOFTEXT)
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (special[IM_END], special[ENDOFTEXT])
    # As in Qwen: the special tokens follow the learned vocabulary, so the pad id is no byte's id and not 0.
    assert sorted(special.values()) == list(range(len(tokenizer) - 3, len(tokenizer)))
    generation = json.loads((rehearsal_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [special[IM_END], special[ENDOFTEXT]]
    assert generation["pad_token_id"] == special[ENDOFTEXT]
    assert eos_token_ids(rehearsal_dir) == {special[IM_END], special[ENDOFTEXT]}
    config = json.loads((rehearsal_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["vocab_size"] == len(tokenizer)
    assert config["head_dim"] == 32 and config["tie_word_embeddings"] and config["dtype"] == "float32"
    assert config["max_position_embeddings"] >= 1024


def test_a_chat_prompt_holds_each_special_token_as_one_id(tokenizer):
    problem = "What is 3 + (4 - 2)?"
    text = format_prompt(tokenizer, problem, "chat")
    assert text == (
        f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n"
        f"{IM_START}user\n{problem} {USER_SUFFIX}{IM_END}\n"
        f"{IM_START}assistant\n"
    )
    ids = encode_prompt(tokenizer, text, "chat")
    special = _special_ids(tokenizer)
    for token, token_id in special.items():
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [token_id]
    counts = Counter(ids)
    assert (counts[special[IM_START]], counts[special[IM_END]], counts[special[ENDOFTEXT]]) == (3, 2, 0)
    assert ids[0] == special[IM_START]  # a chat prompt gets no BOS or other added token
    # No ordinary token holds a piece of a special token's text (the prompt has no other "<", "|" or ">").
    ordinary = [i for i in ids if i not in special.values()]
    assert not any(set(tokenizer.decode([i])) & set("<|>") for i in ordinary)
    header = _assistant_header(tokenizer)
    assert len(header) == 3 and ids[-3:] == header  # <|im_start|>, "assistant", "\n": the generation prompt
    assert tokenizer.decode(ids) == text


def test_bpe_tokens_span_several_characters(tokenizer):
    text = format_prompt(tokenizer, "What is 9 - (3 + 2)?", "chat")
    ids = encode_prompt(tokenizer, text, "chat")
    assert 3 * len(ids) < len(text.encode())  # a character-level tokenizer would need one id per byte
    longest = max(len(tokenizer.decode([i]).encode()) for i in range(len(tokenizer) - 3))
    assert longest >= 5
    for word in ("system", "user", "assistant"):
        assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1


ROUND_TRIP_TEXTS = [
    "  two  spaces,\ttab\n\n  indented line\r\nCRLF and trailing space ",
    "café ünïcödé — 你好 🙂 ∑x² ≤ ∞; ‘quotes’ «guillemets»",
    f"before {IM_END} between {IM_START}assistant\nafter {ENDOFTEXT}",
    "",
]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS, ids=["whitespace", "unicode", "special-tokens", "empty"])
def test_decoding_inverts_encoding_of_any_text(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_decoding_inverts_encoding_of_the_task_text(tokenizer):
    for item in arith_items("validation", 40, seed=3):
        for text in (item.question, item.solution, *(style.render(item, True) for style in STYLES)):
            assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.slow
def test_the_command_builds_the_same_files_from_the_same_seed(
    rehearsal_dir, other_rehearsal_dir, tmp_path, tokenizer
):
    """`ggpo build-rehearsal-model` (a separate process) writes the session's build byte for byte; another
    seed gives other weights; a non-empty folder is kept (the check build-tiny-model shares)."""
    from test_cli import assert_one_error_line, ggpo, ggpo_here

    again = tmp_path / "again"
    result = ggpo("build-rehearsal-model", "--out", str(again), "--seed", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {again}: vocab_size={len(tokenizer)}, parameters=")
    assert 10_000 < int(result.stdout.split("parameters=")[1].split(",")[0]) < 1_000_000
    built = _file_hashes(rehearsal_dir)
    assert _file_hashes(again) == built
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= built.keys()
    assert_one_error_line(ggpo_here("build-rehearsal-model", "--out", str(again)), "exists and is not empty")
    other = _file_hashes(other_rehearsal_dir)
    assert other.keys() == built.keys() and other["tokenizer.json"] == built["tokenizer.json"]
    assert other["model.safetensors"] != built["model.safetensors"]


def test_a_process_that_cannot_set_the_threads_is_refused_before_it_trains(tmp_path, monkeypatch):
    """Where torch ignores set_num_threads (a vLLM CPU engine started in the process binds its threads), the
    weights would be another thread count's, not the seed's: the builders refuse and write nothing."""
    import torch

    from ggpo_offline.core.errors import UserError
    from ggpo_offline.organism.rehearsal import build_rehearsal_model
    from ggpo_offline.organism.tiny import build_tiny_model

    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    refusal = r"^torch keeps 3 threads where {} were asked \(a vLLM engine started in this process binds"
    with pytest.raises(UserError, match=refusal.format(1)):
        build_rehearsal_model(tmp_path / "rehearsal")
    with pytest.raises(UserError, match=refusal.format(2)):
        build_tiny_model(tmp_path / "tiny", steps=1, n_train=8)
    assert list(tmp_path.iterdir()) == []


def _check_pool_rows(pool: Path, tokenizer, model_dir: Path, num_prompts: int, seed: int) -> Counter:
    """Token-level facts of every row: the prompt ids are the pipeline's chat encoding ending in the
    generation prompt; a stopped response ends with exactly one EOS, a cut one has none and the full length;
    the stored text is the response decoded without special tokens. Returns the finish-reason counts."""
    prompts = {}
    for problem in arith_problems("train", num_prompts, seed):
        text = format_prompt(tokenizer, problem.problem, "chat")
        prompts[problem.prompt_id] = (text, encode_prompt(tokenizer, text, "chat"))
    eos = eos_token_ids(model_dir)
    header = _assistant_header(tokenizer)
    reasons: Counter = Counter()
    for row in pl.read_parquet(pool).iter_rows(named=True):
        assert (row["prompt"], row["prompt_token_ids"]) == prompts[row["prompt_id"]]
        assert row["prompt_token_ids"][-len(header) :] == header
        tokens = row["response_token_ids"]
        if row["finish_reason"] == "stop":
            assert tokens[-1] in eos and not set(tokens[:-1]) & eos
        else:
            assert row["finish_reason"] == "length"
            assert len(tokens) == MAX_TOKENS and not set(tokens) & eos
        assert tokenizer.decode(tokens, skip_special_tokens=True) == row["response"]
        assert IM_END not in row["response"] and ENDOFTEXT not in row["response"]
        reasons[row["finish_reason"]] += 1
    return reasons


@pytest.mark.vllm
def test_a_vllm_chat_pool_on_the_rehearsal_model_is_valid_token_by_token(rehearsal_dir, tokenizer, tmp_path):
    """`ggpo generate-pool` in a process of its own: closing a second vLLM engine in this process would tear
    down vLLM's process-wide parallel state under the session's engine on the tiny model."""
    from ggpo_offline.pool.source import read_pool_info
    from ggpo_offline.pool.validate import validate_pool

    pool = tmp_path / "vllm.parquet"
    args = ["--model", str(rehearsal_dir), "--template", "chat", "--num-prompts", "8", "-m", "4"]
    args += ["--max-tokens", str(MAX_TOKENS), "--seed", "0", "--reward-workers", "0", "--out", str(pool)]
    ggpo = str(Path(sys.executable).parent / "ggpo")
    command = [ggpo, "generate-pool", "--engine", "vllm", *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    report = validate_pool(pool)
    assert (report.groups, report.group_size, report.rows) == (8, 4, 32)
    meta = read_pool_info(pool).raw
    assert meta["engine"]["name"] == "vllm" and meta["dtype"] == "float32"
    assert meta["prompt_template"]["kind"] == "chat"
    reasons = _check_pool_rows(pool, tokenizer, rehearsal_dir, num_prompts=8, seed=0)
    assert reasons["stop"] > 0  # the EOS list reaches vLLM


def test_an_hf_chat_pool_trains_from_an_on_policy_update_zero_and_evaluates(
    rehearsal_dir, rehearsal_pool, tokenizer, tmp_path
):
    from transformers import AutoTokenizer

    from ggpo_offline.evaluate.config import EvalConfig
    from ggpo_offline.evaluate.evaluator import evaluate
    from ggpo_offline.pool.validate import validate_pool
    from ggpo_offline.train.config import TrainConfig
    from ggpo_offline.train.trainer import train

    pool = rehearsal_pool
    assert validate_pool(pool).rows == 16 * 16
    reasons = _check_pool_rows(pool, tokenizer, rehearsal_dir, num_prompts=16, seed=0)
    assert reasons["stop"] > reasons["length"] > 0  # most stop with an EOS, some run to the limit

    result = train(
        TrainConfig(
            pool=pool,
            method="ggpo",
            updates=2,
            groups_per_batch=1,
            lr=1e-4,
            ref_refresh=2,
            no_tracking=True,
            out=tmp_path / "run",
        )
    )
    first, second = result.metrics[0], result.metrics[1]
    assert first["update"] == 0
    assert abs(first["mismatch/k3"]) < 1e-6 and abs(first["mismatch/drift"]) < 1e-6
    assert first["mismatch/ess"] == pytest.approx(1.0, abs=1e-6)
    assert first["ref/log_ratio"] == pytest.approx(0.0, abs=1e-6)
    assert second["mismatch/drift"] > 0  # the policy moved
    saved = AutoTokenizer.from_pretrained(str(result.final_model))
    assert saved.chat_template == tokenizer.chat_template and saved.eos_token == IM_END

    report = evaluate(
        EvalConfig(
            model=str(result.final_model),
            datasets=("arith:validation",),
            num_problems=2,
            n=4,
            ks=(1, 4),
            pool=pool,
            engine="hf",
            reward_workers=0,
        )
    )
    bench = report.benchmarks["arith-validation"]
    assert bench.num_problems == 2 and len(bench.counts) == 2
    assert all(isinstance(c, int) and 0 <= c <= 4 for c in bench.counts.values())
    settings = report.settings
    assert settings.prompt_template["kind"] == "chat" and settings.dtype == "float32"
    assert settings.sampling.max_tokens == MAX_TOKENS
