"""The solution styles the tiny model mixes, how each is written, and how to tell them apart in a response."""

from dataclasses import dataclass
from typing import Literal

from ggpo_offline.generate.arith import ArithItem, reductions

PromptClass = Literal["flat", "nested"]
PROMPT_CLASSES: tuple[PromptClass, ...] = ("flat", "nested")
FLAT_LEVELS = (1, 2, 3)
"""Levels 1-3 (one to three operations, no parentheses) are flat; levels 4-5 (parentheses) are nested."""


def prompt_class(level: int) -> PromptClass:
    """The class of an arith problem of this level: which style is right most often depends on it."""
    return "flat" if level in FLAT_LEVELS else "nested"


@dataclass(frozen=True)
class Style:
    """One behaviour of the embedded policy: a marker that opens the response, then a way of answering."""

    name: str
    marker: str
    """The response's first characters; the first one alone decides the style."""
    share: float
    """The base model's probability of opening a response with this style: the pretraining target for the
    first response token, whatever the prompt and whatever style the row goes on in."""
    row_share: float
    """Its share of the pretraining rows: how much of the training budget learns this style's content."""
    second_thought: float
    """The share of its pretraining rows on flat problems that end in a wrong second thought."""
    description: str

    def render(self, item: ArithItem, second_thought: bool = False) -> str:
        """This style's response to ``item`` (without <eos>); ``second_thought`` ends it on a wrong value."""
        if self.name == "careful":
            return f"{self.marker}{_careful_working(item, second_thought)}"
        if self.name == "draft":
            return f"{self.marker}{DRAFT_TEXT}"
        return f"{self.marker}{_left_to_right(item)}"


DRAFT_TEXT = "work it out one step at a time, then check it."
"""The draft style's whole response: a plan with no number in it, so no answer (reward 0)."""
CAREFUL_OPENING = "one operation at a time, checking each.\n"


def _left_to_right(item: ArithItem) -> str:
    """The quick style's one line: the operations from left to right with the brackets dropped, which is
    right exactly when dropping them changes nothing (always on flat problems)."""
    flat = item.question.replace("(", "").replace(")", "")
    steps = reductions(flat)
    facts = ", ".join(f"{step.left} {step.op} {step.right} = {step.value}" for step in steps)
    return f"{facts}. \\boxed{{{steps[-1].value}}}"


def _careful_working(item: ArithItem, second_thought: bool) -> str:
    """The careful style's long working: each operation with its check, then the boxed value (or, after a
    second thought, the value plus one)."""
    lines = [CAREFUL_OPENING]
    for number, step in enumerate(reductions(item.question), start=1):
        inverse = "-" if step.op == "+" else "+"
        check = f"{step.value} {inverse} {step.right} = {step.left}"
        fact = f"{step.left} {step.op} {step.right} = {step.value}"
        lines.append(f"Step {number}: {fact} (check: {check}), so {step.before} becomes {step.after}.\n")
    if second_thought:
        wrong = int(item.answer) + 1
        lines.append(f"The answer is {item.answer}. On second thought, it is {wrong}. \\boxed{{{wrong}}}")
    else:
        lines.append(f"The answer is {item.answer}. \\boxed{{{item.answer}}}")
    return "".join(lines)


# A base model mixes strategies, and which one is right most often depends on the problem:
# - quick works from left to right in one short line and ignores brackets: right on flat problems (no
#   brackets), wrong on nested ones unless the brackets happen not to matter (a + (b - c));
# - careful writes every operation with a check (long: 200-330 characters on nested problems), which is right
#   on nested problems, but on flat ones it second-guesses itself and usually "corrects" a right value to a
#   wrong one (90% of its flat pretraining rows do);
# - draft never gives an answer (a format failure, reward 0).
# So the best prompt-blind choice (one style everywhere) is far below the best prompt-aware one (quick on
# flat, careful on nested): a learner that only shifts the first character blindly cannot reach the second.
#
# No response states a wrong fact (a second thought names no operation; quick's facts are right, only its
# order of operations is not): a learner pushes down every token of a failed response, so failed responses
# here hold correct facts that the other class needs (model card, history).
# The share a style is sampled with and the share of rows that teach it are set apart: a careful chain takes
# far more rows to learn than a constant draft.
STYLES: tuple[Style, ...] = (
    Style("careful", "Careful: ", 0.35, 0.55, 0.90, "works every step with a check; doubts flat problems"),
    Style("quick", "Quick: ", 0.35, 0.35, 0.0, "works left to right in one line, ignoring brackets"),
    Style("draft", "Draft: ", 0.30, 0.10, 0.0, "states a plan but gives no answer"),
)


BEST_STYLE: dict[PromptClass, str] = {"flat": "quick", "nested": "careful"}
"""The style that is right most often in each prompt class, by design (measured: the model card's forced
accuracies per class)."""


def style_of(response: str) -> str:
    """The style a response opened with (its first character decides), or ``other``."""
    for style in STYLES:
        if response[:1] == style.marker[:1]:
            return style.name
    return "other"
