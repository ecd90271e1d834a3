"""The shipped tiny model: char tokenizer, Qwen3 weights, and the recipe that rebuilds them."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ggpo_offline.arith import arith_items
from ggpo_offline.prompts import encode_prompt, format_prompt, resolve_template
from ggpo_offline.tiny import (
    build_tiny_model,
    build_tokenizer,
    evaluate_sampled_accuracy,
    last_boxed,
    tiny_model_dir,
)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_dir())


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir()).eval()


def test_shipped_folder_has_every_file():
    names = {path.name for path in tiny_model_dir().iterdir()}
    expected = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert expected | {"tokenizer_config.json", "MODEL_CARD.md"} <= names


def test_tokenizer_round_trips_text_exactly(tokenizer):
    text = "Question: What is  3 + 4?\n\nAnswer: 3 + 4 = 7.  \\boxed{13}\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tokenizer.decode(ids) == text


def test_tokenizer_maps_unknown_characters_to_unk(tokenizer):
    ids = tokenizer("é∑x", add_special_tokens=False)["input_ids"]
    assert ids[:2] == [tokenizer.unk_token_id] * 2
    assert tokenizer.decode(ids[2:]) == "x"


def test_special_token_ids(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.unk_token_id == 3
    assert len(tokenizer) == 4 + 95 + 1


def test_plain_template_and_bos(tokenizer):
    assert resolve_template(tokenizer, "auto") == "plain"
    text = format_prompt(tokenizer, "What is 1 + 2?", "plain")
    ids = encode_prompt(tokenizer, text, "plain")
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_shipped_tokenizer_is_the_recipe_tokenizer(tokenizer):
    assert tokenizer.get_vocab() == build_tokenizer().get_vocab()


def test_model_shape_and_size(model):
    parameters = sum(parameter.numel() for parameter in model.parameters())
    assert 700_000 < parameters < 900_000
    assert (tiny_model_dir() / "model.safetensors").stat().st_size < 10 * 2**20
    assert model.config.tie_word_embeddings
    assert model.generation_config.eos_token_id == 2 and model.generation_config.pad_token_id == 0


def test_greedy_answer_to_a_level_one_problem_is_well_formed(tokenizer, model):
    item = next(item for item in arith_items("train", 200) if item.level == 1)
    ids = torch.tensor([encode_prompt(tokenizer, format_prompt(tokenizer, item.question, "plain"), "plain")])
    output = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=64)
    completion = output[0, ids.shape[1] :].tolist()
    assert tokenizer.eos_token_id in completion or "\\boxed{" in tokenizer.decode(completion)


def test_last_boxed():
    assert last_boxed("3 = \\boxed{3}, no \\boxed{4}.") == "4"
    assert last_boxed("no answer") is None


def test_build_and_evaluate_smoke(tmp_path):
    threads = torch.get_num_threads()
    stats = build_tiny_model(tmp_path, seed=0, steps=5, n_train=64, warmup_steps=2)
    assert stats["steps"] == 5 and stats["final_loss"] > 0
    assert torch.get_num_threads() == threads  # the recipe's one-thread setting does not leak out
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config.vocab_size == 100
    result = evaluate_sampled_accuracy(tmp_path, n_problems=3, m=2, max_new_tokens=4)
    assert result["n_problems"] == 3 and 0.0 <= result["accuracy"] <= 1.0
    assert 0.0 <= result["mixed_fraction"] <= 1.0
