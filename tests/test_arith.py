"""The synthetic arithmetic task: determinism, splits, and correct worked solutions."""

import hashlib
import re

import pytest

from ggpo_offline.generate.arith import (
    LEVELS,
    MAX_VALUE,
    arith_items,
    arith_problems,
    level_items,
    level_size,
    split_of,
)
from ggpo_offline.generate.problems import Problem


def test_same_arguments_give_the_same_list():
    assert arith_items("train", 200, seed=3) == arith_items("train", 200, seed=3)
    assert arith_items("train", 200, seed=3) != arith_items("train", 200, seed=4)


@pytest.mark.parametrize("split", ["train", "test"])
def test_larger_n_extends_smaller_n(split):
    small = arith_items(split, 50, seed=7)
    large = arith_items(split, 400, seed=7)
    assert large[:50] == small


def test_items_are_distinct_and_split_by_hash_rule():
    train = arith_items("train", 3000, seed=0)
    test = arith_items("test", 600, seed=0)
    train_questions = {item.question for item in train}
    test_questions = {item.question for item in test}
    assert len(train_questions) == len(train) and len(test_questions) == len(test)
    assert not train_questions & test_questions
    for item in train + test:
        is_test = int(hashlib.sha256(item.question.encode()).hexdigest(), 16) % 5 == 0
        assert split_of(item.question) == ("test" if is_test else "train")
    assert all(split_of(question) == "train" for question in train_questions)
    assert all(split_of(question) == "test" for question in test_questions)


def test_test_split_is_about_a_fifth():
    train_size = sum(level_size(level, "train") for level in LEVELS)
    test_size = sum(level_size(level, "test") for level in LEVELS)
    assert 0.17 < test_size / (train_size + test_size) < 0.23


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


def test_levels_are_all_present_and_grow_in_steps():
    items = arith_items("train", 1000, seed=0)
    assert {item.level for item in items} == set(LEVELS)
    first_of_level = {item.level: item for item in reversed(items)}
    assert _operator_count(_steps_of(first_of_level[1].solution)[0][0]) == 1
    assert _operator_count(_steps_of(first_of_level[5].solution)[0][0]) >= 2
    assert "(" in "".join(item.question for item in items if item.level == 5)


def test_small_level_running_out_falls_back_to_the_others():
    n = level_size(1, "test") + 200
    items = arith_items("test", n, seed=0)
    assert sum(item.level == 1 for item in items) == level_size(1, "test")
    assert len({item.question for item in items}) == n


def test_asking_for_more_than_exists_raises():
    everything = sum(level_size(level, "test") for level in LEVELS)
    with pytest.raises(ValueError):
        arith_items("test", everything + 1)


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
