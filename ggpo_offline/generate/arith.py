"""A built-in synthetic arithmetic task: five levels of + and - over digits, with worked solutions.

Problems fall in three disjoint splits, decided by a canonical key rather than the question text, so that
an answer-equivalent reordering of a problem (``8 + 2`` and ``2 + 8``; ``3 + 4 - 2`` and ``4 - 2 + 3``) is
always in the same split as the problem: the key is the expression flattened into its signed terms
(``9 - (3 + 2)`` gives +9 -3 -2) and sorted, and with h its sha256, a problem is in ``test`` iff
h % 5 == 0, in ``validation`` iff h % 5 == 1, else in ``train`` (about 20/20/60 %). Design and tuning look at
validation; test is for final numbers only.
"""

import hashlib
import itertools
import random
import re
from dataclasses import dataclass
from functools import cache
from typing import Literal

from ggpo_offline.generate.problems import Problem

LEVELS = (1, 2, 3, 4, 5)
Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")

# Each level is a set of expression templates and the operand range that fills them. Every combination
# whose intermediate values stay in [0, MAX_VALUE] is a problem, so each level is finite and enumerable.
# Operands are single digits, the operations + and -, and values stay small, so a worked solution is a
# chain of one-operation facts from a table of a few hundred that a ~1M-parameter char-level model can
# learn; stating the value of a two- or three-operation expression at once is what is hard for it.
_LEVEL_TEMPLATES: dict[int, tuple[tuple[str, ...], range]] = {
    1: (("{} + {}", "{} - {}"), range(1, 10)),
    2: (("{} + {} + {}", "{} + {} - {}", "{} - {} + {}", "{} - {} - {}"), range(1, 10)),
    3: (("{} + {} + {} + {}", "{} + {} - {} + {}", "{} - {} + {} + {}", "{} + {} + {} - {}"), range(1, 10)),
    4: (("{} - ({} + {})", "{} - ({} - {})", "{} + ({} - {})"), range(1, 10)),
    5: (("({} + {}) - ({} + {})", "{} + {} - ({} + {})", "{} - ({} - {}) + {}"), range(1, 10)),
}
MAX_VALUE = 40

_PRECEDENCE = {"+": 1, "-": 1, "*": 2}
_TOKEN = re.compile(r"\d+|[-+*()]")


@dataclass(frozen=True)
class ArithItem:
    """One arithmetic problem with its worked solution."""

    question: str
    solution: str
    answer: str
    level: int


@dataclass(frozen=True)
class _Op:
    op: str
    left: "_Expr"
    right: "_Expr"


_Expr = int | _Op


def _parse(text: str) -> _Expr:
    """Parse an expression of non-negative integers, + - * and parentheses (usual precedence)."""
    tokens = _TOKEN.findall(text)
    position = 0

    def parse_level(min_precedence: int) -> _Expr:
        nonlocal position
        left = parse_atom()
        while position < len(tokens) and _PRECEDENCE.get(tokens[position], 0) >= min_precedence:
            op = tokens[position]
            position += 1
            # Left-associative: the right side binds only strictly tighter operators.
            left = _Op(op, left, parse_level(_PRECEDENCE[op] + 1))
        return left

    def parse_atom() -> _Expr:
        nonlocal position
        token = tokens[position]
        position += 1
        if token == "(":
            inner = parse_level(1)
            position += 1  # the closing parenthesis
            return inner
        return int(token)

    return parse_level(1)


def _apply(op: str, left: int, right: int) -> int:
    return left + right if op == "+" else left - right if op == "-" else left * right


def _render(expr: _Expr, parent_precedence: int = 0, is_right_child: bool = False) -> str:
    """Print with only the parentheses the precedence rules need."""
    if isinstance(expr, int):
        return str(expr)
    precedence = _PRECEDENCE[expr.op]
    text = f"{_render(expr.left, precedence)} {expr.op} {_render(expr.right, precedence, True)}"
    # A right operand of equal precedence needs parentheses too: a - (b + c) != a - b + c.
    needs_parens = precedence < parent_precedence or (precedence == parent_precedence and is_right_child)
    return f"({text})" if needs_parens else text


def _reduce_once(expr: _Expr) -> _Expr:
    """Evaluate the leftmost operation whose operands are both numbers, as a person working by hand would."""
    assert isinstance(expr, _Op)
    if isinstance(expr.left, int) and isinstance(expr.right, int):
        return _apply(expr.op, expr.left, expr.right)
    if isinstance(expr.left, _Op):
        return _Op(expr.op, _reduce_once(expr.left), expr.right)
    return _Op(expr.op, expr.left, _reduce_once(expr.right))


@dataclass(frozen=True)
class Reduction:
    """One step of a worked solution: the operation ``left op right = value`` turns ``before`` into
    ``after``."""

    before: str
    left: int
    op: str
    right: int
    value: int
    after: str


def _leftmost_operation(expr: _Expr) -> _Op:
    """The operation `_reduce_once` evaluates: the leftmost one whose operands are both numbers."""
    assert isinstance(expr, _Op)
    if isinstance(expr.left, int) and isinstance(expr.right, int):
        return expr
    return _leftmost_operation(expr.left if isinstance(expr.left, _Op) else expr.right)


def reductions(question: str) -> list[Reduction]:
    """The worked solution of an arith question (``What is ...?``) one operation at a time."""
    expr = _parse(question.removeprefix("What is ").removesuffix("?"))
    steps = []
    while isinstance(expr, _Op):
        operation = _leftmost_operation(expr)
        left, right = operation.left, operation.right
        assert isinstance(left, int) and isinstance(right, int)
        reduced = _reduce_once(expr)
        value = _apply(operation.op, left, right)
        steps.append(Reduction(_render(expr), left, operation.op, right, value, _render(reduced)))
        expr = reduced
    return steps


def _subexpression_values(expr: _Expr) -> list[int]:
    """The value of every node: exactly the numbers that ever appear in the worked solution."""
    if isinstance(expr, int):
        return [expr]
    left, right = _subexpression_values(expr.left), _subexpression_values(expr.right)
    return [_apply(expr.op, left[0], right[0]), *left, *right]


def _steps(expr: _Expr) -> list[str]:
    """The chain of ever-simpler expressions, one operation at a time, ending in the value."""
    steps = [_render(expr)]
    while isinstance(expr, _Op):
        expr = _reduce_once(expr)
        steps.append(_render(expr))
    return steps


def question_hash(question: str) -> str:
    """Hex sha256 of the question text: the prompt id derives from it (the split does not, see `split_of`)."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()


def _signed_terms(expr: _Expr, sign: str = "+") -> list[str]:
    """The expression as a sum of signed terms, parentheses opened: ``9 - (3 + 2)`` -> +9 -3 -2."""
    if isinstance(expr, _Op) and expr.op in "+-":
        flipped = {"+": "-", "-": "+"}[sign] if expr.op == "-" else sign
        return _signed_terms(expr.left, sign) + _signed_terms(expr.right, flipped)
    # A number, or a product (no level has one): one term, kept as written.
    return [sign + _render(expr)]


def canonical_key(question: str) -> str:
    """The question's sorted signed terms (``What is 3 + 4 - 2?`` -> ``+3 +4 -2``): the same for every
    reordering of the terms, which has the same answer."""
    expression = question.removeprefix("What is ").removesuffix("?")
    return " ".join(sorted(_signed_terms(_parse(expression))))


def split_of(question: str) -> Split:
    """The split of a problem, from the sha256 h of its `canonical_key`: ``test`` iff h % 5 == 0,
    ``validation`` iff h % 5 == 1, else ``train`` (about 20/20/60 %).

    Keying on the sorted signed terms, not the question text, puts every reordering of a problem
    (``8 + 2`` and ``2 + 8``) in the same split, so no test or validation answer is learnable by heart from a
    train problem with the same terms."""
    remainder = int(hashlib.sha256(canonical_key(question).encode("utf-8")).hexdigest(), 16) % 5
    return "test" if remainder == 0 else "validation" if remainder == 1 else "train"


def _make_item(expression: str, level: int) -> ArithItem | None:
    """The problem for one filled-in template; None when some step would leave [0, MAX_VALUE]."""
    expr = _parse(expression)
    if not all(0 <= value <= MAX_VALUE for value in _subexpression_values(expr)):
        return None
    steps = _steps(expr)
    answer = steps[-1]
    return ArithItem(
        question=f"What is {steps[0]}?",
        solution=" = ".join(steps) + f". \\boxed{{{answer}}}",
        answer=answer,
        level=level,
    )


@cache
def _all_level_items(level: int) -> tuple[ArithItem, ...]:
    """Every problem of a level, all splits, in a fixed canonical order.

    A question that an easier level also generates belongs to the easier level only, so every question is
    unique across levels. (No two levels' templates overlap today; the rule keeps it so if one is added.)
    The rule looks at the easier levels' problems of every split, so it can never move a question into a
    second split.
    """
    easier = {item.question for lower in LEVELS if lower < level for item in _all_level_items(lower)}
    templates, operands = _LEVEL_TEMPLATES[level]
    items: dict[str, ArithItem] = {}
    for template in templates:
        for numbers in itertools.product(operands, repeat=template.count("{}")):
            item = _make_item(template.format(*numbers), level)
            if item is not None and item.question not in easier:
                items.setdefault(item.question, item)
    return tuple(items.values())


@cache
def level_items(level: int, split: Split) -> tuple[ArithItem, ...]:
    """Every problem of a level in a split (see `split_of`), in a fixed canonical order."""
    return tuple(item for item in _all_level_items(level) if split_of(item.question) == split)


def arith_items(split: Split, n: int, seed: int = 0) -> list[ArithItem]:
    """``n`` distinct problems of a split, each level drawn uniformly by ``random.Random(seed)``.

    Draws are without replacement and never depend on ``n``, so a larger ``n`` extends a smaller one.
    A level that runs out drops out of the draw, so the remaining levels fill the rest.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be 'train', 'validation' or 'test', got {split!r}")
    remaining = {level: list(level_items(level, split)) for level in LEVELS}
    available = sum(len(items) for items in remaining.values())
    if n > available:
        raise ValueError(f"asked for {n} arith {split} problems, but only {available} exist")
    rng = random.Random(seed)
    chosen: list[ArithItem] = []
    while len(chosen) < n:
        open_levels = [level for level in LEVELS if remaining[level]]
        pool = remaining[rng.choice(open_levels)]
        # Swap-remove a random element: O(1) and deterministic for a given seed.
        index = rng.randrange(len(pool))
        pool[index], pool[-1] = pool[-1], pool[index]
        chosen.append(pool.pop())
    return chosen


def arith_problems(split: Split, n: int, seed: int = 0) -> list[Problem]:
    """The same draw as :func:`arith_items`, as :class:`Problem` records."""
    return [
        Problem(
            prompt_id=f"arith-L{item.level}-{question_hash(item.question)[:12]}",
            source=f"arith:{split}",
            problem=item.question,
            answer=item.answer,
        )
        for item in arith_items(split, n, seed)
    ]
