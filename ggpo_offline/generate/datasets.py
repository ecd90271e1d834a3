"""Load problems from the built-in arith task, a local JSONL/JSON/Parquet file or a Hugging Face dataset."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import check_settings, setting
from ggpo_offline.generate.problems import Problem
from ggpo_offline.generate.rewards import AnswerRule, last_boxed_content, plain_number

DEFAULT_ARITH_SIZE = 1000
DEFAULT_HF_SPLIT = "train"
PROBLEM_KEY_CANDIDATES = ("problem", "question", "prompt")
DEFAULT_ANSWER_KEY = "answer"
DEFAULT_SOLUTION_KEY = "solution"


@dataclass(frozen=True)
class DatasetColumns:
    """Which columns of a file or hf dataset hold a problem and its gold answer (None: the usual names),
    and how a boxed answer is compared with the gold; the settings generate-pool and eval share."""

    problem_key: str | None = setting(None, "Problem column [default: problem, question or prompt].")
    answer_key: str | None = setting(None, "Gold answer column [default: answer].")
    solution_key: str | None = setting(
        None, "Solution column whose last \\boxed{} is the gold when there is no answer column."
    )
    answer_rule: Literal["auto", "math-verify", "number"] = setting(
        "auto",
        "How the boxed answer is compared with the gold: math-verify (equivalent expressions count), number "
        "(only a plain number equal to the gold counts) or auto (number for the built-in arith task, "
        "math-verify otherwise).",
    )

    def __post_init__(self) -> None:
        check_settings(self)

    def column_keys(self) -> dict:
        """The column choices, as ``load_dataset``'s keyword arguments."""
        return {
            "problem_key": self.problem_key,
            "answer_key": self.answer_key,
            "solution_key": self.solution_key,
        }


def is_arith_spec(spec: str) -> bool:
    """Whether ``spec`` names the built-in arith task (``arith`` or ``arith:SPLIT``), not a file."""
    return spec == "arith" or spec.startswith("arith:")


def resolve_answer_rule(spec: str, choice: str) -> AnswerRule:
    """The answer rule of dataset ``spec``: ``choice``, with auto meaning number for the built-in arith
    task (whose golds are integers, and where math-verify would also pay a box holding the question's own
    expression) and math-verify for every other dataset."""
    if choice == "auto":
        return "number" if is_arith_spec(spec) else "math-verify"
    return choice


def dataset_answer_rule(spec: str, choice: str, problems: list[Problem]) -> AnswerRule:
    """``resolve_answer_rule``, refused with a UserError when the number rule meets a gold that is not a
    plain number (no response could ever score 1 on that problem)."""
    rule = resolve_answer_rule(spec, choice)
    if rule == "number":
        for index, problem in enumerate(problems):
            if plain_number(problem.answer) is None:
                raise UserError(
                    f"--answer-rule number needs plain-number gold answers, but row {index} (0-based) of "
                    f"{spec} has gold {problem.answer!r}; use --answer-rule math-verify"
                )
    return rule


_READERS = {
    # infer_schema_length=None: look at every row, so a type that changes late doesn't fail the read.
    ".jsonl": lambda source: pl.read_ndjson(source, infer_schema_length=None),
    ".json": lambda source: pl.read_json(source, infer_schema_length=None),
    ".parquet": pl.read_parquet,
}
_GSM8K_FINAL_LINE = re.compile(r"####\s*(.+?)\s*")
_THOUSANDS_SEPARATED = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


@dataclass(frozen=True)
class _Columns:
    """Which columns hold the problem text and the gold (an answer column, or a solution's last box)."""

    problem: str
    answer: str | None
    solution: str | None


@dataclass(frozen=True)
class _Loaded:
    problems: list[Problem]
    source: str
    sha256: str
    split: str | None
    columns: _Columns | None


def load_problems(
    spec: str,
    *,
    problem_key: str | None = None,
    answer_key: str | None = None,
    solution_key: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[Problem]:
    """Problems from ``spec``: ``arith[:train|validation|test]``, a ``.jsonl``/``.json``/``.parquet`` path, or
    ``hf:NAME[:SPLIT]`` (``hf:NAME:CONFIG:SPLIT`` when the dataset needs a config).

    Files and hf datasets keep their row order and ``limit`` takes the first rows; ``seed`` only drives
    the arith draw (whose size is ``limit``, default 1000). The gold is the ``answer_key`` column (default
    ``answer``), else the last ``\\boxed{...}`` of the ``solution_key`` column (default ``solution``).
    Raises UserError with a one-line message for any bad input.
    """
    return _load(spec, problem_key, answer_key, solution_key, split, limit, seed).problems


def load_dataset(
    spec: str,
    *,
    problem_key: str | None = None,
    answer_key: str | None = None,
    solution_key: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> tuple[list[Problem], dict]:
    """The problems of ``spec`` (as ``load_problems``) and what pool metadata records about them: the
    spec, resolved columns and a content sha256 (of the file bytes, of the generated arith problems, or
    of the hf dataset's rows)."""
    loaded = _load(spec, problem_key, answer_key, solution_key, split, limit, seed)
    columns = loaded.columns
    fingerprint = {
        "spec": spec,
        "source": loaded.source,
        "sha256": loaded.sha256,
        "problem_key": columns.problem if columns else None,
        "answer_key": columns.answer if columns else None,
        "solution_key": columns.solution if columns else None,
        "split": loaded.split,
        "limit": limit,
        "seed": seed,
        "num_problems": len(loaded.problems),
    }
    return loaded.problems, fingerprint


def _load(
    spec: str,
    problem_key: str | None,
    answer_key: str | None,
    solution_key: str | None,
    split: str | None,
    limit: int | None,
    seed: int,
) -> _Loaded:
    if limit is not None and limit < 1:
        raise UserError(f"limit must be a positive number of problems, got {limit}")
    if is_arith_spec(spec):
        if problem_key or answer_key or solution_key:
            raise UserError("--problem-key, --answer-key and --solution-key apply to files and hf datasets")
        return _load_arith(spec, split, limit, seed)
    if spec.startswith("hf:"):
        rows, available, source, sha256, split = _read_hf(spec, split)
    else:
        if split is not None:
            raise UserError(f"split {split!r} applies to arith and hf datasets, not to the file {spec}")
        rows, available, source, sha256 = _read_file(Path(spec))
    columns = _resolve_columns(available, source, problem_key, answer_key, solution_key)
    problems = _to_problems(rows[:limit], columns, source)
    return _Loaded(problems, source, sha256, split, columns)


def _split_from_spec(spec_split: str | None, split: str | None, default: str) -> str:
    if spec_split and split and spec_split != split:
        raise UserError(f"the spec says split {spec_split!r} but split {split!r} was also given")
    return spec_split or split or default


def _load_arith(spec: str, split: str | None, limit: int | None, seed: int) -> _Loaded:
    # Imported on use: only this spec needs the generator.
    from ggpo_offline.generate.arith import arith_problems

    split = _split_from_spec(spec.partition(":")[2], split, "train")
    if split not in ("train", "validation", "test"):
        raise UserError(f"unknown arith split {split!r}: use arith:train, arith:validation or arith:test")
    try:
        problems = arith_problems(split, DEFAULT_ARITH_SIZE if limit is None else limit, seed)
    except ValueError as error:
        raise UserError(str(error)) from error
    dumped = json.dumps([dataclasses.asdict(problem) for problem in problems], sort_keys=True)
    return _Loaded(problems, f"arith:{split}", _sha256_text(dumped), split, None)


def _read_file(path: Path) -> tuple[list[dict], list[str], str, str]:
    """Rows, column names, source name and sha256 of a local dataset file."""
    if not path.is_file():
        raise UserError(f"dataset file not found: {path}")
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise UserError(
            f"unsupported dataset file type {path.suffix!r} ({path}): use .jsonl, .json or .parquet"
        )
    data = path.read_bytes()
    if not data.strip():
        raise UserError(f"dataset {path} is empty (0 rows)")
    try:
        frame = reader(io.BytesIO(data))
    except Exception as error:
        raise UserError(f"could not read {path}: {_first_line(error)}") from error
    if frame.height == 0:
        raise UserError(f"dataset {path} is empty (0 rows)")
    return frame.to_dicts(), frame.columns, path.name, hashlib.sha256(data).hexdigest()


def _read_hf(spec: str, split: str | None) -> tuple[list[dict], list[str], str, str, str]:
    """Rows, column names, source name, sha256 of the rows and split of a Hugging Face dataset."""
    parts = spec.removeprefix("hf:").split(":")
    if not parts[0] or len(parts) > 3:
        raise UserError(f"bad hf spec {spec!r}: use hf:NAME, hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")
    name, config = parts[0], parts[1] if len(parts) == 3 else None
    split = _split_from_spec(parts[-1] if len(parts) > 1 else None, split, DEFAULT_HF_SPLIT)
    try:
        import datasets  # optional and heavy: only hf specs need it
    except ImportError as error:
        raise UserError("hf: datasets need the `datasets` package (pip install datasets)") from error
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as error:
        raise UserError(
            f"could not load Hugging Face dataset {name!r} split {split!r}: {_first_line(error)}"
        ) from error
    rows = [dict(row) for row in dataset]
    source = f"hf:{name}:{split}" if config is None else f"hf:{name}:{config}:{split}"
    if not rows:
        raise UserError(f"dataset {source} is empty (0 rows)")
    sha256 = _sha256_text(json.dumps(rows, sort_keys=True, ensure_ascii=False, default=str))
    return rows, list(dataset.column_names), source, sha256, split


def _resolve_columns(
    available: list[str],
    source: str,
    problem_key: str | None,
    answer_key: str | None,
    solution_key: str | None,
) -> _Columns:
    listed = ", ".join(available)

    def require(key: str) -> str:
        if key not in available:
            raise UserError(f"column {key!r} not found in {source}; available columns: {listed}")
        return key

    if answer_key and solution_key:
        raise UserError("give either --answer-key or --solution-key, not both")
    if problem_key:
        problem = require(problem_key)
    else:
        problem = next((key for key in PROBLEM_KEY_CANDIDATES if key in available), None)
        if problem is None:
            raise UserError(
                f"{source} has no problem, question or prompt column; choose one with --problem-key "
                f"(available columns: {listed})"
            )
    if answer_key:
        return _Columns(problem, require(answer_key), None)
    if solution_key:
        return _Columns(problem, None, require(solution_key))
    if DEFAULT_ANSWER_KEY in available:
        return _Columns(problem, DEFAULT_ANSWER_KEY, None)
    if DEFAULT_SOLUTION_KEY in available:
        return _Columns(problem, None, DEFAULT_SOLUTION_KEY)
    raise UserError(
        f"{source} has no answer or solution column; choose one with --answer-key or --solution-key "
        f"(available columns: {listed})"
    )


def _to_problems(rows: list[dict], columns: _Columns, source: str) -> list[Problem]:
    texts, golds = [], []
    for index, row in enumerate(rows):
        text = row[columns.problem]
        if text is None or not str(text).strip():
            raise UserError(f"row {index} (0-based) of {source} has an empty {columns.problem!r}")
        texts.append(str(text))
        golds.append(_gold_answer(row, index, columns, source))
    return [
        Problem(prompt_id=prompt_id, source=source, problem=text, answer=gold)
        for prompt_id, text, gold in zip(_prompt_ids(texts), texts, golds, strict=True)
    ]


def _gold_answer(row: dict, index: int, columns: _Columns, source: str) -> str:
    if columns.answer is not None:
        gold, where = answer_text(row[columns.answer]), f"column {columns.answer!r} is empty"
    else:
        solution = row[columns.solution]
        gold = last_boxed_content(str(solution)) if solution is not None else None
        where = f"column {columns.solution!r} has no complete \\boxed{{...}}"
    if not gold:
        raise UserError(f"cannot determine the gold answer of row {index} (0-based) of {source}: {where}")
    return gold


def answer_text(value: object) -> str | None:
    """The gold answer a raw answer value stands for: first element of a list, numbers as text, and the
    ``N`` of a GSM8K-style final line ``#### N`` (thousands commas removed); None when empty."""
    if isinstance(value, (list, tuple)):
        return answer_text(value[0]) if value else None
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # a float column turns 18 into 18.0
    text = str(value).strip()
    final_line = _GSM8K_FINAL_LINE.fullmatch(text.splitlines()[-1].strip()) if text else None
    if final_line:
        text = final_line.group(1)
        if _THOUSANDS_SEPARATED.fullmatch(text):
            text = text.replace(",", "")
    return text or None


def _prompt_ids(texts: list[str]) -> list[str]:
    """sha256 of the text (16 hex chars), with ``#k`` for the k-th repeat of the same text."""
    seen: Counter[str] = Counter()
    ids = []
    for text in texts:
        digest = _sha256_text(text)[:16]
        repeat = seen[text]
        seen[text] += 1
        ids.append(digest if repeat == 0 else f"{digest}#{repeat}")
    return ids


def _sha256_text(text: str) -> str:
    # surrogatepass: a lone surrogate in the data must not make hashing fail.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _first_line(error: Exception) -> str:
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__
