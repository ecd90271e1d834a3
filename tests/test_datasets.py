"""Tests for loading problems: specs, column mapping, gold answers, prompt ids, fingerprints and errors."""

import hashlib
import json
import re
import sys
from pathlib import Path

import polars as pl
import pytest

from ggpo_offline.core.errors import UserError
from ggpo_offline.generate.datasets import answer_text, load_dataset, load_problems
from ggpo_offline.generate.rewards import last_boxed_content

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


def dataset_fingerprint(spec: str, **kwargs) -> dict:
    """What a pool's footer records about the dataset of ``spec``: the metadata half of `load_dataset`."""
    return load_dataset(spec, **kwargs)[1]


def real_file(name: str) -> Path:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"real benchmark file {path} is absent (expected in ../shared/data next to the repo)")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def short_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def user_error(spec: str, **kwargs) -> str:
    with pytest.raises(UserError) as caught:
        load_problems(spec, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_math500_with_problem_and_answer_columns():
    path = real_file("math500.jsonl")
    rows = read_jsonl(path)
    problems = load_problems(str(path), problem_key="problem", answer_key="answer")
    assert len(problems) == 500
    assert [problem.answer for problem in problems] == [row["answer"] for row in rows]
    assert [problem.problem for problem in problems] == [row["problem"] for row in rows]
    assert {problem.source for problem in problems} == {"math500.jsonl"}
    assert len({problem.prompt_id for problem in problems}) == 500
    assert problems[0].prompt_id == short_sha(rows[0]["problem"])
    # The default keys find the same columns.
    assert load_problems(str(path)) == problems


def test_math500_gold_from_the_solutions_last_box(tmp_path):
    path = real_file("math500.jsonl")
    rows = read_jsonl(path)
    expected = [last_boxed_content(row["solution"]) for row in rows]
    assert [problem.answer for problem in load_problems(str(path), solution_key="solution")] == expected
    # Without an answer column the solution column is used by default.
    no_answers = write_jsonl(
        tmp_path / "math500_no_answer.jsonl",
        [{k: v for k, v in row.items() if k != "answer"} for row in rows],
    )
    problems = load_problems(str(no_answers))
    assert [problem.answer for problem in problems] == expected
    assert problems[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_gsm8k_question_and_final_answer_line():
    path = real_file("gsm8k_test.jsonl")
    rows = read_jsonl(path)
    problems = load_problems(str(path), problem_key="question", answer_key="answer")
    assert len(problems) == 1319
    assert rows[0]["answer"].endswith("#### 18")
    assert problems[0].answer == "18"
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", problem.answer) for problem in problems)
    with_commas = next(index for index, row in enumerate(rows) if row["answer"].endswith("#### 2,125"))
    assert problems[with_commas].answer == "2125"
    # question is a default problem column too.
    assert load_problems(str(path)) == problems


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["5", "6"], "5"),
        ([7], "7"),
        ([], None),
        (12, "12"),
        (18.0, "18"),
        (2.5, "2.5"),
        ("  \\frac{1}{2} ", "\\frac{1}{2}"),
        ("She makes 9 * 2 = 18.\n#### 18", "18"),
        ("#### 1,450,000", "1450000"),
        ("#### -3", "-3"),
        ("", None),
        (None, None),
    ],
)
def test_answer_text(value, expected):
    assert answer_text(value) == expected


def test_list_and_number_answers_from_a_file(tmp_path):
    path = write_jsonl(
        tmp_path / "lists.jsonl",
        [{"question": "q1", "answer": ["5", "6"]}, {"question": "q2", "answer": ["7"]}],
    )
    assert [problem.answer for problem in load_problems(str(path))] == ["5", "7"]
    numbers = write_jsonl(
        tmp_path / "numbers.jsonl", [{"prompt": "p1", "answer": 3}, {"prompt": "p2", "answer": 4}]
    )
    assert [problem.answer for problem in load_problems(str(numbers))] == ["3", "4"]


def test_unusual_unicode_loads(tmp_path):
    texts = [
        "😀 emoji ∑ 中文",
        "zero\u200bwidth and rtl \u05e9\u05dc\u05d5\u05dd",
        "private \ue000 use",
        "tab\tand\u00a0nbsp",
    ]
    path = tmp_path / "unicode.jsonl"
    lines = [json.dumps({"problem": text, "answer": "1"}) for text in texts]
    lines.append('{"problem": "lone \\ud800 surrogate", "answer": "1"}')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    problems = load_problems(str(path))
    assert [problem.problem for problem in problems[:4]] == texts
    assert len(problems) == 5 and len({problem.prompt_id for problem in problems}) == 5


def test_duplicate_texts_get_distinct_stable_ids(tmp_path):
    path = write_jsonl(
        tmp_path / "dups.jsonl", [{"problem": text, "answer": "1"} for text in ["a", "a", "b", "a"]]
    )
    ids = [problem.prompt_id for problem in load_problems(str(path))]
    assert ids == [short_sha("a"), short_sha("a") + "#1", short_sha("b"), short_sha("a") + "#2"]
    assert [problem.prompt_id for problem in load_problems(str(path))] == ids
    # A prefix of the file keeps the same ids.
    assert [problem.prompt_id for problem in load_problems(str(path), limit=2)] == ids[:2]


def test_parquet_and_json_files(tmp_path):
    frame = pl.DataFrame({"problem": ["one", "two"], "answer": ["1", "2"]})
    frame.write_parquet(tmp_path / "set.parquet")
    (tmp_path / "set.json").write_text(json.dumps(frame.to_dicts()), encoding="utf-8")
    from_parquet = load_problems(str(tmp_path / "set.parquet"))
    assert [(problem.problem, problem.answer) for problem in from_parquet] == [("one", "1"), ("two", "2")]
    assert from_parquet[0].source == "set.parquet"
    assert [problem.prompt_id for problem in load_problems(str(tmp_path / "set.json"))] == [
        problem.prompt_id for problem in from_parquet
    ]


def test_limit_takes_the_first_rows():
    path = real_file("math500.jsonl")
    problems = load_problems(str(path), limit=5)
    assert problems == load_problems(str(path))[:5]


def test_arith_specs():
    first = load_problems("arith:test", limit=5)
    assert len(first) == 5 and {problem.source for problem in first} == {"arith:test"}
    assert load_problems("arith", split="test", limit=5) == first
    assert load_problems("arith", limit=5)[0].source == "arith:train"
    assert load_problems("arith:test", limit=5, seed=1) != first
    assert len(load_problems("arith:train")) == 1000


def test_arith_validation_split_loads():
    from ggpo_offline.generate.arith import arith_problems, split_of

    validation = load_problems("arith:validation", limit=50)
    assert validation == arith_problems("validation", 50)
    assert {problem.source for problem in validation} == {"arith:validation"}
    assert {split_of(problem.problem) for problem in validation} == {"validation"}
    assert load_problems("arith", split="validation", limit=50) == validation
    assert dataset_fingerprint("arith:validation", limit=5)["split"] == "validation"
    test_questions = {problem.problem for problem in load_problems("arith:test")}
    assert test_questions and not test_questions & {problem.problem for problem in validation}


def test_fingerprints(tmp_path):
    path = real_file("gsm8k_test.jsonl")
    fingerprint = dataset_fingerprint(str(path), limit=10)
    assert fingerprint["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (fingerprint["problem_key"], fingerprint["answer_key"], fingerprint["solution_key"]) == (
        "question",
        "answer",
        None,
    )
    assert (fingerprint["num_problems"], fingerprint["source"], fingerprint["spec"]) == (
        10,
        "gsm8k_test.jsonl",
        str(path),
    )
    arith = dataset_fingerprint("arith:test", limit=5)
    assert arith == dataset_fingerprint("arith:test", limit=5)
    assert arith["sha256"] != dataset_fingerprint("arith:test", limit=5, seed=1)["sha256"]
    assert arith["split"] == "test"
    solution_only = write_jsonl(tmp_path / "s.jsonl", [{"problem": "p", "solution": "so \\boxed{4}"}])
    assert dataset_fingerprint(str(solution_only))["solution_key"] == "solution"


def test_missing_file():
    assert "dataset file not found" in user_error("/no/such/file.jsonl")


def test_unsupported_extension(tmp_path):
    path = tmp_path / "set.csv"
    path.write_text("problem,answer\nq,1\n")
    assert "unsupported dataset file type '.csv'" in user_error(str(path))


def test_missing_columns(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [{"text": "q", "label": "1", "answer": "1"}])
    message = user_error(str(path), problem_key="nope")
    assert (
        "column 'nope' not found in set.jsonl" in message
        and "available columns: text, label, answer" in message
    )
    assert "no problem, question or prompt column" in user_error(str(path))
    assert "column 'gold' not found" in user_error(str(path), problem_key="text", answer_key="gold")
    no_gold = write_jsonl(tmp_path / "nogold.jsonl", [{"problem": "q", "label": "1"}])
    assert "no answer or solution column" in user_error(str(no_gold))


def test_empty_datasets(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    assert "is empty (0 rows)" in user_error(str(tmp_path / "empty.jsonl"))
    (tmp_path / "empty.json").write_text("[]")
    assert "is empty (0 rows)" in user_error(str(tmp_path / "empty.json"))


def test_unreadable_file(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"problem": "q", "answer": \n')
    assert user_error(str(tmp_path / "broken.jsonl")).startswith("could not read")


def test_rows_without_a_gold_answer(tmp_path):
    path = write_jsonl(
        tmp_path / "set.jsonl", [{"problem": "q0", "answer": "1"}, {"problem": "q1", "answer": None}]
    )
    assert "gold answer of row 1 (0-based) of set.jsonl" in user_error(str(path))
    assert len(load_problems(str(path), limit=1)) == 1  # rows past the limit are not read
    unboxed = write_jsonl(tmp_path / "sol.jsonl", [{"problem": "q0", "solution": "it is \\boxed{5"}])
    assert "gold answer of row 0 (0-based)" in user_error(str(unboxed))
    empty_problem = write_jsonl(tmp_path / "blank.jsonl", [{"problem": " ", "answer": "1"}])
    assert "row 0 (0-based) of blank.jsonl has an empty 'problem'" in user_error(str(empty_problem))


def test_bad_arguments(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [{"problem": "q", "answer": "1", "solution": "\\boxed{1}"}])
    assert "not both" in user_error(str(path), answer_key="answer", solution_key="solution")
    assert "applies to arith and hf" in user_error(str(path), split="test")
    assert "limit must be a positive" in user_error(str(path), limit=0)
    expected = "unknown arith split 'dev': use arith:train, arith:validation or arith:test"
    assert user_error("arith:dev") == expected
    assert "but split 'train' was also given" in user_error("arith:test", split="train")
    assert "apply to files and hf datasets" in user_error("arith", problem_key="question")
    assert "bad hf spec" in user_error("hf:")


def test_hf_without_the_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    assert "need the `datasets` package" in user_error("hf:openai/gsm8k:main:test")


class FakeHfDataset(list):
    """Stands in for a ``datasets.Dataset``: iterable rows plus ``column_names``."""

    column_names = ["question", "answer"]


def test_hf_specs_with_a_stand_in_datasets_package(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        if name == "missing/set":
            raise FileNotFoundError("Dataset 'missing/set' doesn't exist on the Hub\nmore detail")
        return FakeHfDataset([{"question": "q1", "answer": "#### 1,000"}, {"question": "q2", "answer": "2"}])

    monkeypatch.setitem(sys.modules, "datasets", type(sys)("datasets"))
    monkeypatch.setattr(sys.modules["datasets"], "load_dataset", load_dataset, raising=False)
    problems = load_problems("hf:openai/gsm8k:main:test")
    assert [problem.answer for problem in problems] == ["1000", "2"]
    assert {problem.source for problem in problems} == {"hf:openai/gsm8k:main:test"}
    assert load_problems("hf:some/set", limit=1)[0].source == "hf:some/set:train"
    assert calls[:2] == [("openai/gsm8k", "main", "test"), ("some/set", None, "train")]
    fingerprint = dataset_fingerprint("hf:some/set:validation")
    assert (fingerprint["split"], fingerprint["problem_key"]) == ("validation", "question")
    assert fingerprint == dataset_fingerprint("hf:some/set", split="validation") | {
        "spec": "hf:some/set:validation"
    }
    assert "could not load Hugging Face dataset 'missing/set' split 'train': Dataset" in user_error(
        "hf:missing/set"
    )
