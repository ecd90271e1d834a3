"""The shipped tiny model: char tokenizer, Qwen3 weights, and the recipe that rebuilds them."""

import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from ggpo_offline.core.model_io import tiny_model_dir
from ggpo_offline.generate.arith import ArithItem, arith_items, split_of
from ggpo_offline.generate.prompts import encode_prompt, format_prompt, resolve_template
from ggpo_offline.generate.rewards import last_boxed_content as last_boxed
from ggpo_offline.organism.measure import _style_scores, evaluate_sampled_accuracy, measure_styles
from ggpo_offline.organism.styles import STYLES, style_of
from ggpo_offline.organism.tiny import (
    IGNORE_INDEX,
    _collate,
    _pretraining_loss,
    _training_examples,
    build_config,
    build_tiny_model,
    build_tokenizer,
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


ITEM = ArithItem("What is 9 - (3 + 4)?", "9 - (3 + 4) = 9 - 7 = 2. \\boxed{2}", "2", 4)


def test_each_style_renders_and_is_told_apart_by_its_first_character():
    rendered = {style.name: style.render(ITEM) for style in STYLES}
    assert rendered == {
        "careful": "Careful: 9 - (3 + 4) = 9 - 7 = 2. \\boxed{2}",
        "quick": "Quick: \\boxed{2}",
        "draft": "Draft: work it out one step at a time, then check it.",
    }
    assert all(style_of(text) == name for name, text in rendered.items())
    assert [last_boxed(text) for text in rendered.values()] == ["2", "2", None]  # a draft never scores
    # The draft (always wrong) holds no digit: learners push down every token of a failed response.
    assert not any(character.isdigit() for character in rendered["draft"])
    assert len({style.marker[0] for style in STYLES}) == len(STYLES)
    assert style_of("7") == style_of("") == "other"
    assert abs(sum(style.share for style in STYLES) - 1) < 1e-12
    assert abs(sum(style.row_share for style in STYLES) - 1) < 1e-12


def test_training_rows_hold_train_split_problems_only():
    tokenizer = build_tokenizer()
    examples, _ = _training_examples(tokenizer, 400, seed=0)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for rows in examples for ids, _ in rows]
    questions = {re.match(r"Question: (What is [^?]*\?)", text).group(1) for text in texts}
    assert len(questions) == 400
    assert {split_of(question) for question in questions} == {"train"}


def test_pretraining_loss_scores_the_first_response_token_against_the_style_shares():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(build_config(tokenizer))
    examples, _ = _training_examples(tokenizer, 2, seed=0)
    rows = [examples[0][0], examples[1][1], examples[0][2]]  # careful, quick, draft rows of unequal length
    batch = _collate(rows, tokenizer.pad_token_id)
    marker_ids = [tokenizer.convert_tokens_to_ids(style.marker[0]) for style in STYLES]
    # With all weight on one style, the loss is the ordinary mean token cross-entropy of rows in that style.
    careful_only = _pretraining_loss(model, _collate(rows[:1], 0), marker_ids, torch.tensor([1.0, 0.0, 0.0]))
    assert careful_only.item() == pytest.approx(model(**_collate(rows[:1], 0)).loss.item(), rel=1e-6)
    # With the shares, each row's own marker token is replaced by -sum_s share_s log p(marker_s).
    shares = torch.tensor([style.share for style in STYLES])
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    log_probs = logits.log_softmax(-1)
    total, count = 0.0, 0
    for row, (ids, labels) in enumerate(rows):
        first = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        total -= (log_probs[row, first - 1, marker_ids] * shares).sum().item()
        total -= sum(log_probs[row, i - 1, ids[i]].item() for i in range(first + 1, len(ids)))
        count += len(ids) - first
    expected = total / count
    assert _pretraining_loss(model, batch, marker_ids, shares).item() == pytest.approx(expected, rel=1e-5)


def test_style_scores_count_shares_and_accuracy_per_style_and_level():
    other = ArithItem("What is 1 + 1?", "1 + 1 = 2. \\boxed{2}", "2", 1)
    responses = [
        ["Careful: x \\boxed{2}", "Quick: \\boxed{16}", "Quick: \\boxed{2}", "Draft: 2"],
        ["Careful: \\boxed{2}", "Careful: \\boxed{3}", "Quick: \\boxed{2}", "9"],
    ]
    scores = _style_scores([ITEM, other], responses)
    assert scores["accuracy"] == 4 / 8 and scores["pass_at_m"] == 1.0
    assert scores["styles"]["careful"] == {"share": 3 / 8, "accuracy": 2 / 3}
    assert scores["styles"]["quick"] == {"share": 3 / 8, "accuracy": 2 / 3}
    assert scores["styles"]["draft"] == {"share": 1 / 8, "accuracy": 0.0}
    assert scores["styles"]["other"] == {"share": 1 / 8, "accuracy": 0.0}
    assert scores["by_level"][1]["careful"] == {"share": 2 / 4, "accuracy": 1 / 2}
    assert scores["by_level"][4]["accuracy"] == 2 / 4


def test_forcing_a_marker_forces_the_style():
    report = measure_styles(tiny_model_dir(), n_problems=4, m=2, max_new_tokens=8)
    assert set(report["forced"]) == {style.name for style in STYLES}
    assert abs(sum(scores["share"] for scores in report["styles"].values()) - 1) < 1e-9
    assert 0.0 <= report["accuracy"] <= report["pass_at_m"] <= 1.0


def test_measuring_draws_validation_problems_unless_told_otherwise(monkeypatch):
    from ggpo_offline.organism import measure as measure_module

    drawn = []

    def fake_sampling(model_dir, items, m, *args, **kwargs):
        drawn.append(items)
        return [["Quick: \\boxed{0}"] * m for _ in items]

    monkeypatch.setattr(measure_module, "sample_responses", fake_sampling)
    model_dir = tiny_model_dir()
    runs = {
        "validation": measure_module.measure_styles(model_dir, n_problems=30, m=2, forced=False),
        "test": measure_module.measure_styles(model_dir, n_problems=30, m=2, forced=False, split="test"),
    }
    for (split, report), items in zip(runs.items(), drawn, strict=True):
        assert report["split"] == split and {split_of(item.question) for item in items} == {split}
    assert measure_module.evaluate_sampled_accuracy(model_dir, n_problems=30, m=2)["split"] == "validation"
    assert {split_of(item.question) for item in drawn[-1]} == {"validation"}


def test_measure_styles_command_passes_its_split(monkeypatch):
    import sys

    from ggpo_cli.main import main

    from ggpo_offline.organism import measure as measure_module

    received = []

    def record(model_dir, **kwargs):
        received.append(kwargs)
        sys.exit(0)

    monkeypatch.setattr(measure_module, "measure_styles", record)
    for argv, split in ((["measure-styles"], "validation"), (["measure-styles", "--split", "test"], "test")):
        monkeypatch.setattr(sys, "argv", ["ggpo", *argv])
        with pytest.raises(SystemExit):
            main()
        assert received[-1]["split"] == split
