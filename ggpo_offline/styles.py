"""The solution styles the tiny model mixes, how each is written, and how to tell them apart in a response."""

import re
from dataclasses import dataclass

from ggpo_offline.arith import ArithItem


@dataclass(frozen=True)
class Style:
    """One behaviour of the embedded policy: a marker that opens the response, then a way of answering."""

    name: str
    marker: str
    """The response's first characters; the first one alone decides the style."""
    share: float
    """Its share of the pretraining data, hence about its share of the base model's samples."""
    description: str

    def render(self, item: ArithItem) -> str:
        """This style's response to ``item`` (without <eos>)."""
        chain = item.solution.split(". \\boxed{")[0]
        if self.name == "careful":
            return f"{self.marker}{chain}. \\boxed{{{item.answer}}}"
        if self.name == "draft":
            return f"{self.marker}{chain}, so {item.answer}."
        return f"{self.marker}\\boxed{{{sum_of_numbers(item.question)}}}"


def sum_of_numbers(question: str) -> int:
    """The quick style's shortcut: add up every number in the question, whatever the signs."""
    return sum(int(number) for number in re.findall(r"\d+", question))


# A base model mixes strategies: one that is almost always right (reduce one operation at a time, box the
# value), a shortcut that skips the work (add up every number at once: right only when every operation is
# an addition) and one that does the work but never boxes the answer (a format failure: reward 0). RL on a
# pool of such samples can only select; the best it can reach is the careful style alone (the ceiling).
STYLES: tuple[Style, ...] = (
    Style("careful", "Careful: ", 0.25, "reduces one operation at a time, then boxes the value"),
    Style("quick", "Quick: ", 0.35, "boxes the sum of every number in the question, without working"),
    Style("draft", "Draft: ", 0.40, "reduces one operation at a time but leaves the value unboxed"),
)
BEST_STYLE = "careful"
STYLE_BY_NAME = {style.name: style for style in STYLES}


def style_of(response: str) -> str:
    """The style a response opened with (its first character decides), or ``other``."""
    for style in STYLES:
        if response[:1] == style.marker[:1]:
            return style.name
    return "other"
