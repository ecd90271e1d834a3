"""The shipped tiny model: char tokenizer, Qwen3 weights, and the recipe that rebuilds them."""

import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from ggpo_offline.core.model_io import tiny_model_dir
from ggpo_offline.generate.arith import ArithItem, arith_items, split_of
from ggpo_offline.generate.prompts import encode_prompt, format_prompt, resolve_template
from ggpo_offline.generate.rewards import last_boxed_content as last_boxed
from ggpo_offline.organism.measure import _style_scores, is_right, measure_styles
from ggpo_offline.organism.styles import STYLES, prompt_class, style_of
from ggpo_offline.organism.tiny import (
    IGNORE_INDEX,
    _pretraining_loss,
    _training_examples,
    build_config,
    build_tiny_model,
    build_tokenizer,
    collate,
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
    output = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=384)
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
    report = measure_styles(tmp_path, n_problems=3, m=2, max_new_tokens=4, forced=False)
    assert report["n_problems"] == 3 and 0.0 <= report["accuracy"] <= report["pass_at_m"] <= 1.0


ITEM = ArithItem("What is 9 - (3 + 4)?", "9 - (3 + 4) = 9 - 7 = 2. \\boxed{2}", "2", 4)
FLAT_ITEM = ArithItem("What is 8 - 3 + 2?", "8 - 3 + 2 = 5 + 2 = 7. \\boxed{7}", "7", 2)
FACT = re.compile(r"(\d+) ([-+]) (\d+) = (\d+)")


def test_each_style_renders_and_is_told_apart_by_its_first_character():
    rendered = {style.name: style.render(ITEM) for style in STYLES}
    assert rendered == {
        "careful": "Careful: one operation at a time, checking each.\n"
        "Step 1: 3 + 4 = 7 (check: 7 - 4 = 3), so 9 - (3 + 4) becomes 9 - 7.\n"
        "Step 2: 9 - 7 = 2 (check: 2 + 7 = 9), so 9 - 7 becomes 2.\n"
        "The answer is 2. \\boxed{2}",
        "quick": "Quick: 9 - 3 = 6, 6 + 4 = 10. \\boxed{10}",
        "draft": "Draft: work it out one step at a time, then check it.",
    }
    assert all(style_of(text) == name for name, text in rendered.items())
    # quick drops the brackets: wrong on this nested problem; a draft never scores
    assert [last_boxed(text) for text in rendered.values()] == ["2", "10", None]
    # The draft (always wrong) holds no digit: learners push down every token of a failed response.
    assert not any(character.isdigit() for character in rendered["draft"])
    assert len({style.marker[0] for style in STYLES}) == len(STYLES)
    assert style_of("7") == style_of("") == "other"
    assert abs(sum(style.share for style in STYLES) - 1) < 1e-12
    assert abs(sum(style.row_share for style in STYLES) - 1) < 1e-12


def test_a_second_thought_boxes_a_wrong_value_without_writing_a_wrong_fact():
    careful = next(style for style in STYLES if style.name == "careful")
    plain, doubted = careful.render(FLAT_ITEM), careful.render(FLAT_ITEM, second_thought=True)
    assert doubted == plain.replace(
        "The answer is 7. \\boxed{7}", "The answer is 7. On second thought, it is 8. \\boxed{8}"
    )
    assert last_boxed(plain) == "7" and last_boxed(doubted) == "8"
    for item in arith_items("train", 300, seed=2):
        for text in (careful.render(item), careful.render(item, second_thought=True)):
            facts = FACT.findall(text)
            assert len(facts) == 2 * len(item.solution.split(" = ")) - 2  # each step and its check
            assert all(int(a) + (int(b) if op == "+" else -int(b)) == int(c) for a, op, b, c in facts)


def test_careful_is_long_on_nested_problems_and_quick_is_right_exactly_where_brackets_do_not_matter():
    """The careful style is the long one: at least 200 characters (= tokens) on every nested problem."""
    careful, quick = (next(style for style in STYLES if style.name == name) for name in ("careful", "quick"))
    items = arith_items("validation", 500, seed=0)
    nested = [len(careful.render(item)) for item in items if prompt_class(item.level) == "nested"]
    assert min(nested) >= 200 and max(nested) < 340
    assert max(len(quick.render(item)) for item in items) < 70
    assert [prompt_class(level) for level in (1, 2, 3, 4, 5)] == ["flat", "flat", "flat", "nested", "nested"]
    for item in items:
        unbracketed = eval(
            item.question.removeprefix("What is ").removesuffix("?").replace("(", "").replace(")", "")
        )
        assert is_right(quick.render(item), item) == (str(unbracketed) == item.answer)
        assert is_right(quick.render(item), item) or prompt_class(item.level) == "nested"
    wrong_on_nested = [not is_right(quick.render(i), i) for i in items if prompt_class(i.level) == "nested"]
    assert 0.6 < sum(wrong_on_nested) / len(wrong_on_nested) < 1


def test_training_rows_hold_train_split_problems_only():
    tokenizer = build_tokenizer()
    examples, _, _ = _training_examples(tokenizer, 400, seed=0)
    texts = [
        tokenizer.decode(ids, skip_special_tokens=True)
        for rows in examples
        for variants in rows
        for ids, _ in variants
    ]
    questions = {re.match(r"Question: (What is [^?]*\?)", text).group(1) for text in texts}
    assert len(questions) == 400
    assert {split_of(question) for question in questions} == {"train"}


def test_only_the_careful_style_on_flat_problems_has_second_thoughts():
    tokenizer = build_tokenizer()
    examples, _, flat = _training_examples(tokenizer, 200, seed=0)
    items = arith_items("train", 200, seed=0)
    assert flat == [prompt_class(item.level) == "flat" for item in items] and 0 < sum(flat) < len(flat)
    for rows, is_flat in zip(examples, flat, strict=True):
        assert [len(variants) for variants in rows] == [2 if is_flat else 1, 1, 1]
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids, _ in rows[0]]
        assert ["second thought" in text for text in texts] == ([False, True] if is_flat else [False])
    assert [style.second_thought for style in STYLES] == [0.9, 0.0, 0.0]


def test_pretraining_loss_scores_the_first_response_token_against_the_style_shares():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(build_config(tokenizer))
    examples, _, _ = _training_examples(tokenizer, 2, seed=0)
    rows = [examples[0][0][0], examples[1][1][0], examples[0][2][0]]  # careful, quick, draft: unequal lengths
    batch = collate(rows, tokenizer.pad_token_id)
    marker_ids = [tokenizer.convert_tokens_to_ids(style.marker[0]) for style in STYLES]
    # With all weight on one style, the loss is the ordinary mean token cross-entropy of rows in that style.
    careful_sum, careful_count = _pretraining_loss(
        model, collate(rows[:1], 0), marker_ids, torch.tensor([1.0, 0.0, 0.0])
    )
    assert (careful_sum / careful_count).item() == pytest.approx(
        model(**collate(rows[:1], 0)).loss.item(), rel=1e-6
    )
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
    loss_sum, loss_count = _pretraining_loss(model, batch, marker_ids, shares)
    assert loss_count == count and loss_sum.item() == pytest.approx(total, rel=1e-5)


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
    assert scores["by_class"]["flat"]["careful"] == {"share": 2 / 4, "accuracy": 1 / 2}
    assert scores["by_class"]["nested"] == scores["by_level"][4]
    assert (scores["by_class"]["flat"]["problems"], scores["by_class"]["nested"]["problems"]) == (1, 1)


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


def _style_by_class_sampling(model_dir, items, m, seed=0, max_new_tokens=0, prefix="", engine=None):
    """Fake sampling: forced quick is right on flat problems only, forced careful on nested ones only, a draft
    never; free sampling opens half the responses with each of quick and draft."""

    def response(item, style: str) -> str:
        right = {"Quick: ": "flat", "Careful: ": "nested"}.get(style) == prompt_class(item.level)
        return (
            style + ("x" * 10 if style == "Careful: " else "") + f"\\boxed{{{item.answer if right else -1}}}"
        )

    if prefix:
        return [[response(item, prefix)] * m for item in items]
    return [[response(item, "Quick: "), response(item, "Draft: ")] * (m // 2) for item in items]


def test_measure_styles_reports_both_ceilings_and_lengths_per_class(monkeypatch):
    from ggpo_offline.organism import measure as measure_module

    monkeypatch.setattr(measure_module, "sample_responses", _style_by_class_sampling)
    report = measure_module.measure_styles(tiny_model_dir(), n_problems=40, m=2)
    items = arith_items("validation", 40, seed=0)
    flat_share = sum(prompt_class(item.level) == "flat" for item in items) / 40
    assert 0.5 < flat_share < 1
    assert report["forced_by_class"]["quick"] == {"flat": 1.0, "nested": 0.0}
    assert report["forced_by_class"]["careful"] == {"flat": 0.0, "nested": 1.0}
    assert report["forced"]["quick"] == pytest.approx(flat_share)
    assert report["prompt_blind_ceiling"] == {"accuracy": flat_share, "style": "quick"}
    assert report["prompt_aware_ceiling"] == {
        "accuracy": 1.0,
        "styles": {"flat": "quick", "nested": "careful"},
    }
    assert report["accuracy"] == pytest.approx(flat_share / 2)
    assert report["by_class"]["flat"]["quick"] == {"share": 0.5, "accuracy": 1.0}
    careful_length = len("Careful: xxxxxxxxxx\\boxed{-1}")  # "-1" on flat problems
    assert report["lengths"]["careful"]["flat"]["max"] == careful_length
    assert report["lengths"]["quick"]["nested"]["median"] == len("Quick: \\boxed{-1}")


def test_the_card_command_rewrites_only_the_measured_section(monkeypatch, tmp_path, capsys):
    import sys

    from ggpo_cli.main import main

    from ggpo_offline.organism import measure as measure_module
    from ggpo_offline.organism.card import BEGIN, END

    monkeypatch.setattr(measure_module, "sample_responses", _style_by_class_sampling)
    card = tmp_path / "MODEL_CARD.md"
    card.write_text(f"# Card\n\nprose\n\n{BEGIN}\nold numbers\n{END}\n\nmore prose\n")
    argv = ["ggpo", "measure-styles", "--num-problems", "40", "--n", "2", "--card", str(card)]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    text = card.read_text()
    assert text.startswith(f"# Card\n\nprose\n\n{BEGIN}\nMeasured by `ggpo measure-styles --num-problems 40")
    assert text.endswith(f"{END}\n\nmore prose\n") and "old numbers" not in text
    assert "| prompt-aware ceiling (quick on flat, careful on nested, forced) | **100.0%** |" in text
    card.write_text("# Card without a measured section\n")
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        f"error: --card {card}: no measured section to replace (it needs the lines {BEGIN} and {END})\n"
    )
    assert card.read_text() == "# Card without a measured section\n"


def test_a_started_engine_samples_the_style_measures_reproducibly_and_forces_each_marker(
    vllm_engine, tiny_dir
):
    """arc-report samples its style measures with one vLLM engine for every checkpoint: the same call gives
    the same responses, a forced marker opens every response, and free sampling shows several styles."""
    from ggpo_offline.organism.measure import sample_responses

    items = arith_items("validation", 8, 0)
    free = sample_responses(tiny_dir, items, 4, engine=vllm_engine)
    assert free == sample_responses(tiny_dir, items, 4, engine=vllm_engine)
    assert [len(responses) for responses in free] == [4] * 8
    assert len({style_of(r) for responses in free for r in responses}) >= 2
    for style in STYLES:
        forced = sample_responses(tiny_dir, items, 2, prefix=style.marker, engine=vllm_engine)
        assert {style_of(r) for responses in forced for r in responses} == {style.name}
        assert all(r.startswith(style.marker) and len(r) > len(style.marker) for g in forced for r in g)
    report = measure_styles(tiny_dir, n_problems=8, m=4, forced=False, engine=vllm_engine)
    assert report["n_problems"] == 8 and abs(sum(s["share"] for s in report["styles"].values()) - 1) < 1e-9
