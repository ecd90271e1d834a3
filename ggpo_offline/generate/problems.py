"""The Problem record shared by every prompt source."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One math problem with its gold answer."""

    prompt_id: str
    """Stable identifier: the same problem from the same source always gets the same id."""
    source: str
    """Where the problem came from, e.g. ``arith:train``, ``arith:validation`` or ``math500.jsonl``."""
    problem: str
    """The problem text shown to the model (before prompt formatting)."""
    answer: str
    """Gold final answer, compared with the response's last boxed answer under the dataset's answer rule
    (``rewards.ANSWER_RULE_DESCRIPTIONS``: math-verify equivalence, or a plain number equal to it)."""
