"""The answer rule: on arith only a plain number equal to the gold earns reward 1 (a box holding the
question's own expression scores 0), through the scorer, generate-pool, eval and the organism's scoring."""

import json
import re
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from conftest import shared_file

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import load_tokenizer, tiny_model_dir
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.evaluator import evaluate
from ggpo_offline.generate.arith import arith_items
from ggpo_offline.generate.datasets import (
    DatasetColumns,
    dataset_answer_rule,
    load_problems,
    resolve_answer_rule,
)
from ggpo_offline.generate.engines import SamplingSettings
from ggpo_offline.generate.engines.base import Sample
from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool
from ggpo_offline.generate.rewards import (
    ANSWER_RULE_DESCRIPTIONS,
    ANSWER_RULES,
    RewardResult,
    RewardScorer,
    plain_number,
    score_response,
)
from ggpo_offline.organism.measure import is_right
from ggpo_offline.organism.styles import STYLES, prompt_class
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.pool.validate import validate_pool

# What a rule pays, not how long it may take: with the 5 s default a loaded 2-core machine (load ~10) made a
# first math-verify call (sympy warming up) time out and score 0.
NO_TIME_LIMIT_S = 120.0
# Boxes a policy could emit for "What is 3 + 4?" (gold 7) that math-verify pays but that hold no answer.
HACKS = ["\\boxed{3 + 4}", "\\boxed{8 = 7}", "\\boxed{What is 3 + 4?}", "\\boxed{4 + 3}", "\\boxed{7 + 0}"]


@pytest.mark.parametrize("response", HACKS)
def test_a_box_holding_no_plain_number_scores_zero_under_the_number_rule(response):
    content = response[len("\\boxed{") : -1]
    assert score_response(response, "7", rule="number") == RewardResult(0.0, content, "not_a_number")


def test_math_verify_pays_the_hacks_the_number_rule_refuses():
    # The caveat the number rule exists for: math-verify evaluates the box, so expressions equal to 7 pass.
    paid = [score_response(hack, "7", timeout_s=NO_TIME_LIMIT_S).reward for hack in HACKS]
    assert paid == [1.0, 1.0, 0.0, 1.0, 1.0]
    explicit = [score_response(hack, "7", NO_TIME_LIMIT_S, rule="math-verify").reward for hack in HACKS]
    assert explicit == paid


@pytest.mark.parametrize("workers", [0, 2])
def test_the_scorer_applies_the_rule_in_process_and_in_workers(workers):
    pairs = [(hack, "7") for hack in HACKS] + [("so \\boxed{7}", "7"), ("\\boxed{8}", "7"), ("seven", "7")]
    with RewardScorer(workers) as scorer:
        results = scorer.submit(pairs, rule="number").get()
        math_verify = scorer.submit(pairs, rule="math-verify").get()
    assert [(r.reward, r.status) for r in results] == [(0.0, "not_a_number")] * 5 + [
        (1.0, "ok"),
        (0.0, "ok"),
        (0.0, "no_box"),
    ]
    assert [r.reward for r in math_verify] == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_one_scorer_scores_batches_of_different_rules_and_a_rule_per_pair():
    with RewardScorer(workers=1) as scorer:
        number = scorer.submit([("\\boxed{3 + 4}", "7")], rule="number")
        math_verify = scorer.submit([("\\boxed{3 + 4}", "7")], rule="math-verify")
        per_pair = scorer.submit([("\\boxed{3 + 4}", "7")] * 2, rule=["math-verify", "number"])
        assert [r.status for r in number.get()] == ["not_a_number"]
        assert [r.reward for r in math_verify.get()] == [1.0]
        assert [(r.reward, r.status) for r in per_pair.get()] == [(1.0, "ok"), (0.0, "not_a_number")]


def test_an_unknown_rule_or_a_rule_list_of_the_wrong_length_is_refused_before_scoring():
    with pytest.raises(ValueError, match=r"^unknown answer rule 'exact'; choose one of math-verify, number$"):
        score_response("\\boxed{7}", "7", rule="exact")
    with RewardScorer(workers=0) as scorer:
        with pytest.raises(ValueError, match="unknown answer rule 'exact'"):
            scorer.submit([("\\boxed{7}", "7")], rule="exact")
        with pytest.raises(ValueError, match=r"^1 answer rules for 2 pairs$"):
            scorer.submit([("\\boxed{7}", "7")] * 2, rule=["number"])


@pytest.mark.parametrize(
    ("content", "value"),
    [
        ("7", Decimal(7)),
        (" 7 ", Decimal(7)),
        ("+7", Decimal(7)),
        ("-12", Decimal(-12)),
        ("07", Decimal(7)),  # a leading zero is still the number itself, not an expression: accepted
        ("7.0", Decimal(7)),
        ("2.50", Decimal("2.5")),
        ("7.", None),  # a decimal point needs digits after it
        (".5", None),
        ("1,000", None),  # thousands separators are text (GSM8K golds have them removed on loading)
        ("1e3", None),
        ("7/1", None),
        ("\\frac{14}{2}", None),
        ("7\\%", None),
        ("\\$7", None),
        ("{7}", None),
        ("- 7", None),
        ("\u0667", None),  # ARABIC-INDIC DIGIT SEVEN: only ASCII digits are plain numbers
        ("", None),
    ],
)
def test_plain_number(content, value):
    assert plain_number(content) == value
    expected = RewardResult(1.0, content.strip(), "ok") if value == 7 else None
    if expected is not None:
        assert score_response(f"\\boxed{{{content}}}", "7", rule="number") == expected


def test_numeric_equality_and_its_edges():
    assert score_response("\\boxed{7.0}", "7", rule="number").reward == 1.0
    assert score_response("\\boxed{7}", "7.00", rule="number").reward == 1.0
    assert score_response("\\boxed{-0}", "0", rule="number").reward == 1.0
    assert score_response("\\boxed{7.000001}", "7", rule="number") == RewardResult(0.0, "7.000001", "ok")
    assert score_response("\\boxed{-7}", "7", rule="number") == RewardResult(0.0, "-7", "ok")
    # Only the last complete box counts, as under math-verify: an earlier right box does not rescue it.
    assert score_response("\\boxed{7} or \\boxed{3 + 4}", "7", rule="number").status == "not_a_number"
    assert score_response("\\boxed{3 + 4} = \\boxed{7}", "7", rule="number").reward == 1.0
    # A gold the rule cannot read scores every response 0, as an unparseable gold does under math-verify.
    assert score_response("\\boxed{7}", "\\frac{1}{2}", rule="number") == RewardResult(0.0, "7", "error")
    huge = "1" + "0" * 100_000
    assert score_response(f"\\boxed{{{huge}}}", huge, rule="number").reward == 1.0


def test_every_response_style_of_the_tiny_model_is_scored_as_its_content_deserves():
    items = arith_items("test", 40, seed=3)
    for item in items:
        careful, quick, draft = (style.render(item) for style in STYLES)
        doubted = STYLES[0].render(item, second_thought=True)
        assert score_response(careful, item.answer, rule="number") == RewardResult(1.0, item.answer, "ok")
        assert score_response(doubted, item.answer, rule="number").reward == 0.0
        flat = prompt_class(item.level) == "flat"  # quick drops the brackets: right on every flat problem
        assert score_response(quick + "\n", item.answer, rule="number").reward == (
            1.0 if flat else is_right(quick, item)
        )
        assert score_response(draft, item.answer, rule="number").status == "no_box"
        assert is_right(careful, item) and not is_right(draft, item) and (is_right(quick, item) or not flat)
        expression = item.question.removeprefix("What is ").removesuffix("?")
        assert not is_right(f"Quick: \\boxed{{{expression}}}", item)
        assert score_response(f"\\boxed{{{expression}}}", item.answer).reward == 1.0  # math-verify would pay


def test_auto_means_number_on_arith_and_math_verify_elsewhere():
    assert DatasetColumns().answer_rule == "auto"
    assert [resolve_answer_rule(spec, "auto") for spec in ("arith", "arith:train", "arith:test")] == [
        "number"
    ] * 3
    for spec in ("math500.jsonl", "data/arith.jsonl", "hf:openai/gsm8k:main:test"):
        assert resolve_answer_rule(spec, "auto") == "math-verify"
    assert resolve_answer_rule("arith:test", "math-verify") == "math-verify"
    assert resolve_answer_rule("gsm8k.jsonl", "number") == "number"
    with pytest.raises(
        UserError, match=r"^unknown --answer-rule 'exact'; choose one of auto, math-verify, number$"
    ):
        DatasetColumns(answer_rule="exact")
    assert set(ANSWER_RULE_DESCRIPTIONS) == set(ANSWER_RULES) == {"math-verify", "number"}


def test_the_number_rule_refuses_a_dataset_whose_gold_is_not_a_plain_number(tmp_path):
    data = tmp_path / "mixed.jsonl"
    data.write_text('{"problem": "a", "answer": "12"}\n{"problem": "b", "answer": "\\\\frac{1}{2}"}\n')
    problems = load_problems(str(data))
    assert dataset_answer_rule(str(data), "auto", problems) == "math-verify"
    message = (
        f"--answer-rule number needs plain-number gold answers, but row 1 (0-based) of {data} has gold "
        "'\\\\frac{1}{2}'; use --answer-rule math-verify"
    )
    with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
        dataset_answer_rule(str(data), "number", problems)
    assert dataset_answer_rule("arith:test", "auto", load_problems("arith:test", limit=50)) == "number"


def test_real_benchmarks_keep_math_verify_and_gsm8k_can_opt_into_the_number_rule():
    math500 = str(shared_file("math500.jsonl"))
    problems = load_problems(math500, limit=60)
    assert dataset_answer_rule(math500, "auto", problems) == "math-verify"
    rows = [json.loads(line) for line in Path(math500).read_text().splitlines()[:60]]
    pairs = [(row["solution"], problem.answer) for row, problem in zip(rows, problems, strict=True)]
    in_process = RewardScorer(workers=0, timeout_s=NO_TIME_LIMIT_S)
    unchanged = in_process.submit(pairs, rule="math-verify").get()
    assert unchanged == in_process.submit(pairs).get()  # the default: what every earlier pool used
    assert sum(r.reward for r in unchanged) >= 58
    with pytest.raises(UserError, match="--answer-rule number needs plain-number gold answers"):
        dataset_answer_rule(math500, "number", problems)
    gsm8k = str(shared_file("gsm8k_test.jsonl"))
    golds = [p.answer for p in load_problems(gsm8k)]
    assert dataset_answer_rule(gsm8k, "number", load_problems(gsm8k)) == "number"
    results = in_process.submit([(f"\\boxed{{{gold}}}", gold) for gold in golds], rule="number").get()
    assert len(golds) == 1319 and all(r.reward == 1.0 for r in results)


class _ScriptedEngine:
    """An engine whose i-th response to "What is E?" is the i-th of: E boxed, its value boxed, "E = value"
    boxed, a draft; so the rule alone decides which responses earn a reward."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def describe(self) -> dict:
        return {"name": "scripted", "version": "0", "dtype": "float32", "logprobs_mode": "raw"}

    def responses(self, prompt: str) -> list[str]:
        expression = re.search(r"What is (.+?)\?", prompt).group(1)
        value = eval(expression)  # arith questions are +, -, * and parentheses over small integers
        return [
            f"\\boxed{{{expression}}}",
            f"Quick: \\boxed{{{value}}}",
            f"\\boxed{{{expression} = {value}}}",
            "Draft: no answer",
        ]

    def generate(self, prompts, seeds, sampling) -> list[list[Sample]]:
        groups = []
        for ids in prompts:
            texts = self.responses(self.tokenizer.decode(ids, skip_special_tokens=True))
            groups.append([self._sample(texts[i % len(texts)]) for i in range(sampling.m)])
        return groups

    def _sample(self, text: str) -> Sample:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Sample(ids, [-0.5] * len(ids), "stop")

    def load_weights(self, model_dir) -> None:
        raise AssertionError("the scripted engine has no weights to load")

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def scripted_engine():
    return _ScriptedEngine(load_tokenizer(tiny_model_dir()))


def _scripted_pool(tmp_path, engine, answer_rule: str) -> Path:
    config = GenerateConfig(
        num_prompts=6,
        sampling=SamplingSettings(m=4, max_tokens=64),
        columns=DatasetColumns(answer_rule=answer_rule),
        out=tmp_path / f"{answer_rule}.parquet",
        reward_workers=0,
        batch_prompts=4,
    )
    return generate_pool(config, engine=engine)


def test_a_pool_on_arith_pays_only_the_boxed_number(tmp_path, scripted_engine):
    pool = _scripted_pool(tmp_path, scripted_engine, "auto")
    validate_pool(pool)
    frame = pl.read_parquet(pool)
    assert frame["reward"].to_list() == [0.0, 1.0, 0.0, 0.0] * 6
    assert frame.filter(pl.col("sample_idx") == 0)["extracted_answer"].to_list() == [
        re.search(r"What is (.+?)\?", prompt).group(1)
        for prompt in frame.filter(pl.col("sample_idx") == 0)["prompt"]
    ]
    reward = read_pool_info(pool).raw["reward"]
    assert reward["answer_rule"] == "number"
    assert reward["answer_rules"] == {"number": ANSWER_RULE_DESCRIPTIONS["number"]}
    assert (reward["verifier"], reward["timeouts"], reward["errors"]) == (None, 0, 0)
    assert read_pool_info(pool).raw["config"]["answer_rule"] == "auto"


def test_a_pool_opting_back_into_math_verify_pays_the_expression(tmp_path, scripted_engine):
    pool = _scripted_pool(tmp_path, scripted_engine, "math-verify")
    assert pl.read_parquet(pool)["reward"].to_list() == [1.0, 1.0, 1.0, 0.0] * 6
    reward = read_pool_info(pool).raw["reward"]
    assert reward["answer_rule"] == "math-verify" and reward["verifier"].startswith("math-verify ")


def test_eval_records_each_benchmarks_rule_and_scores_each_under_it(tmp_path, scripted_engine):
    data = tmp_path / "mini.jsonl"
    data.write_text(
        '{"problem": "What is 2 + 3?", "answer": "5"}\n{"problem": "What is 7 - 4?", "answer": "3"}\n'
    )
    config = EvalConfig(
        model=str(tiny_model_dir()),
        datasets=("arith:test", str(data)),
        num_problems=3,
        n=4,
        ks=(1, 4),
        reward_workers=0,
        batch_prompts=8,  # one engine call holds both benchmarks: the rule is chosen per problem
    )
    report = evaluate(config, engine=scripted_engine)
    assert [set(b.counts.values()) for b in report.benchmarks.values()] == [{1}, {3}]
    reward = report.settings.reward
    assert reward["answer_rule_by_benchmark"] == {"arith-test": "number", "mini": "math-verify"}
    assert set(reward["answer_rules"]) == {"math-verify", "number"}


def test_an_hf_pool_on_arith_records_and_applies_the_number_rule(hf_pool):
    frame = pl.read_parquet(hf_pool)
    assert read_pool_info(hf_pool).raw["reward"]["answer_rule"] == "number"
    for response, answer, reward, extracted in frame.select(
        "response", "answer", "reward", "extracted_answer"
    ).iter_rows():
        fresh = score_response(response, answer, rule="number")
        assert (fresh.reward, fresh.extracted_answer) == (reward, extracted)
    assert 0 < frame["reward"].mean() < 1


def test_measure_styles_scores_like_the_pool():
    from ggpo_offline.organism.measure import _style_scores

    item = arith_items("test", 1, seed=0)[0]
    responses = [f"Quick: \\boxed{{{item.answer}.0}}", f"Quick: \\boxed{{0{item.answer}}}"]
    expression = item.question.removeprefix("What is ").removesuffix("?")
    responses += [f"Quick: \\boxed{{{expression}}}", "Draft: no answer"]
    scores = _style_scores([item], [responses])
    pool_rewards = [score_response(text, item.answer, rule="number").reward for text in responses]
    assert pool_rewards == [1.0, 1.0, 0.0, 0.0]
    assert scores["accuracy"] == sum(pool_rewards) / 4 and scores["styles"]["quick"]["accuracy"] == 2 / 3
