"""The synthetic arithmetic task: determinism, splits, and correct worked solutions."""

import ast
import hashlib
import itertools
import re
from collections import defaultdict

import pytest

from ggpo_offline.generate import arith
from ggpo_offline.generate.arith import (
    _LEVEL_TEMPLATES,
    LEVELS,
    MAX_VALUE,
    SPLITS,
    Reduction,
    _make_item,
    arith_items,
    arith_problems,
    canonical_key,
    level_items,
    reductions,
    split_of,
)
from ggpo_offline.generate.problems import Problem


def test_same_arguments_give_the_same_list():
    assert arith_items("train", 200, seed=3) == arith_items("train", 200, seed=3)
    assert arith_items("train", 200, seed=3) != arith_items("train", 200, seed=4)


@pytest.mark.parametrize("split", SPLITS)
def test_larger_n_extends_smaller_n(split):
    small = arith_items(split, 50, seed=7)
    large = arith_items(split, 400, seed=7)
    assert large[:50] == small


def _signed_terms(question: str) -> tuple[int, ...]:
    """The question's terms with their signs, parentheses opened, sorted: an independent reading (Python's
    parser) of what makes two problems answer-equivalent reorderings of each other."""

    def terms(node: ast.expr, sign: int) -> list[int]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            right_sign = -sign if isinstance(node.op, ast.Sub) else sign
            return terms(node.left, sign) + terms(node.right, right_sign)
        assert isinstance(node, ast.Constant), ast.dump(node)
        return [sign * node.value]

    expression = re.fullmatch(r"What is (.*)\?", question).group(1)
    return tuple(sorted(terms(ast.parse(expression, mode="eval").body, 1)))


def _every_question() -> set[str]:
    """Every question any level generates, enumerated from the templates without the split rule."""
    questions = set()
    for level, (templates, operands) in _LEVEL_TEMPLATES.items():
        for template in templates:
            for numbers in itertools.product(operands, repeat=template.count("{}")):
                item = _make_item(template.format(*numbers), level)
                if item is not None:
                    questions.add(item.question)
    return questions


def _questions_by_split() -> dict[str, list[str]]:
    return {
        split: [item.question for level in LEVELS for item in level_items(level, split)] for split in SPLITS
    }


def test_splits_are_disjoint_and_cover_every_problem():
    by_split = _questions_by_split()
    every = [question for questions in by_split.values() for question in questions]
    assert len(every) == len(set(every))  # no question in two splits, nor in two levels of one split
    assert set(every) == _every_question()
    for split, questions in by_split.items():
        assert all(split_of(question) == split for question in questions)


def test_split_rule_hashes_the_sorted_signed_terms():
    for question in _every_question():
        key = canonical_key(question)
        assert tuple(sorted(int(term) for term in key.split())) == _signed_terms(question), question
        remainder = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5
        assert split_of(question) == {0: "test", 1: "validation"}.get(remainder, "train"), question


def test_split_sizes_are_about_60_20_20():
    sizes = {split: sum(len(level_items(level, split)) for level in LEVELS) for split in SPLITS}
    total = sum(sizes.values())
    assert total == 31731
    assert 0.57 < sizes["train"] / total < 0.63
    assert 0.17 < sizes["validation"] / total < 0.23
    assert 0.17 < sizes["test"] / total < 0.23


def test_no_reordering_of_a_problem_is_in_another_split():
    groups: dict[tuple[int, ...], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for split, questions in _questions_by_split().items():
        for question in questions:
            groups[_signed_terms(question)][split].append(question)
    mixed = {terms: dict(splits) for terms, splits in groups.items() if len(splits) > 1}
    assert not mixed, next(iter(mixed.values()))
    # Not vacuous: most problems have a reordering (or a level-4/5 twin: 9 - (3 + 2) and 9 - 3 - 2).
    twins = sum(len(group) for splits in groups.values() for group in splits.values() if len(group) > 1)
    assert twins == 31_607  # of 31,731 problems


@pytest.mark.parametrize(
    "questions",
    [
        ("What is 8 + 2?", "What is 2 + 8?"),
        ("What is 3 + 4 - 2?", "What is 4 - 2 + 3?", "What is 3 - 2 + 4?"),
        ("What is 9 - (3 + 2)?", "What is 9 - 3 - 2?", "What is 9 - 2 - 3?"),
        ("What is 1 + 2 - (3 + 4)?", "What is 2 + 1 - (4 + 3)?", "What is 2 - 3 + 1 - 4?"),
    ],
)
def test_reorderings_share_key_and_split(questions):
    assert len({canonical_key(question) for question in questions}) == 1
    assert len({split_of(question) for question in questions}) == 1


def test_canonical_key_examples():
    assert canonical_key("What is 3 + 4 - 2?") == "+3 +4 -2"
    assert canonical_key("What is 9 - (3 + 2)?") == "+9 -2 -3"
    assert canonical_key("What is 9 - (3 - 2) + 4?") == "+2 +4 +9 -3"
    assert canonical_key("What is 8 - 2?") != canonical_key("What is 2 - 8?")


def test_an_easier_level_keeps_a_shared_question_in_one_split(monkeypatch):
    # No two levels overlap today: give level 2 level 1's templates too; the rule hands them to level 1.
    templates, operands = _LEVEL_TEMPLATES[2]
    monkeypatch.setitem(_LEVEL_TEMPLATES, 2, (templates + _LEVEL_TEMPLATES[1][0], operands))
    arith._all_level_items.cache_clear()
    arith.level_items.cache_clear()
    try:
        level_one = {item.question for split in SPLITS for item in level_items(1, split)}
        level_two = {item.question for split in SPLITS for item in level_items(2, split)}
        assert len(level_one) == 126 and not level_one & level_two
        everything = _questions_by_split()
        assert sum(map(len, everything.values())) == len(set().union(*everything.values()))
    finally:
        arith._all_level_items.cache_clear()
        arith.level_items.cache_clear()


def _steps_of(solution: str) -> tuple[list[str], str]:
    match = re.fullmatch(r"(.*)\. \\boxed\{(\d+)\}", solution)
    assert match, solution
    return match.group(1).split(" = "), match.group(2)


def _operator_count(expression: str) -> int:
    return len(re.findall(r" [-+*] ", expression))


def test_worked_solutions_are_right_one_operation_at_a_time():
    items = arith_items("train", 1500, seed=1) + arith_items("test", 300, seed=1)
    for item in items:
        steps, boxed = _steps_of(item.solution)
        assert boxed == item.answer
        assert item.question == f"What is {steps[0]}?"
        assert steps[-1] == item.answer
        assert int(item.answer) >= 0
        for step in steps:
            assert re.fullmatch(r"[\d +*()-]+", step), step
            assert eval(step) == int(item.answer), item.solution  # only digits, + - * and parentheses
        operator_counts = [_operator_count(step) for step in steps]
        assert operator_counts == list(range(operator_counts[0], -1, -1)), item.solution


def test_reductions_follow_the_worked_solution_one_operation_at_a_time():
    assert reductions("What is 9 - (3 + 4)?") == [
        Reduction("9 - (3 + 4)", 3, "+", 4, 7, "9 - 7"),
        Reduction("9 - 7", 9, "-", 7, 2, "2"),
    ]
    for item in arith_items("train", 1500, seed=1):
        steps, _ = _steps_of(item.solution)
        chain = reductions(item.question)
        assert [step.before for step in chain] == steps[:-1] and [step.after for step in chain] == steps[1:]
        for step in chain:
            assert step.value == eval(f"{step.left} {step.op} {step.right}")
            # the operation reduced is in the expression as written (leftmost with two numbers)
            assert f"{step.left} {step.op} {step.right}" in step.before


def test_levels_are_all_present_and_grow_in_steps():
    items = arith_items("train", 1000, seed=0)
    assert {item.level for item in items} == set(LEVELS)
    first_of_level = {item.level: item for item in reversed(items)}
    assert _operator_count(_steps_of(first_of_level[1].solution)[0][0]) == 1
    assert _operator_count(_steps_of(first_of_level[5].solution)[0][0]) >= 2
    assert "(" in "".join(item.question for item in items if item.level == 5)


@pytest.mark.parametrize("split", ["validation", "test"])
def test_small_level_running_out_falls_back_to_the_others(split):
    n = len(level_items(1, split)) + 200
    items = arith_items(split, n, seed=0)
    assert sum(item.level == 1 for item in items) == len(level_items(1, split))
    assert len({item.question for item in items}) == n


def test_asking_for_more_than_exists_raises():
    everything = sum(len(level_items(level, "validation")) for level in LEVELS)
    with pytest.raises(ValueError, match=f"asked for {everything + 1} arith validation problems, but only"):
        arith_items("validation", everything + 1)
    with pytest.raises(ValueError, match="split must be 'train', 'validation' or 'test', got 'dev'"):
        arith_items("dev", 1)


def test_problems_have_stable_ids_and_sources():
    problems = arith_problems("test", 40, seed=2)
    items = arith_items("test", 40, seed=2)
    assert problems == arith_problems("test", 40, seed=2)
    for problem, item in zip(problems, items, strict=True):
        assert isinstance(problem, Problem)
        digest = hashlib.sha256(item.question.encode()).hexdigest()
        assert problem.prompt_id == f"arith-L{item.level}-{digest[:12]}"
        assert problem.source == "arith:test"
        assert (problem.problem, problem.answer) == (item.question, item.answer)
    assert len({problem.prompt_id for problem in problems}) == len(problems)


def test_known_example():
    question = "What is 9 - (3 + 4)?"
    item = next(item for item in level_items(4, split_of(question)) if item.question == question)
    assert item.solution == "9 - (3 + 4) = 9 - 7 = 2. \\boxed{2}"
    assert (item.answer, item.level) == ("2", 4)


def test_operands_are_digits_operations_plus_or_minus_and_values_small():
    for level in LEVELS:
        for item in level_items(level, "test"):
            assert all(len(number) == 1 for number in re.findall(r"\d+", item.question)), item.question
            assert "*" not in item.question
            assert all(0 <= int(number) <= MAX_VALUE for number in re.findall(r"\d+", item.solution))
