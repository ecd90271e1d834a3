"""The solution styles the tiny model mixes, how each is written, and how to tell them apart in a response."""

from dataclasses import dataclass

from ggpo_offline.generate.arith import ArithItem


@dataclass(frozen=True)
class Style:
    """One behaviour of the embedded policy: a marker that opens the response, then a way of answering."""

    name: str
    marker: str
    """The response's first characters; the first one alone decides the style."""
    share: float
    """The base model's probability of opening a response with this style: the pretraining target for the
    first response token, whatever style the row goes on in."""
    row_share: float
    """Its share of the pretraining rows: how much of the training budget learns this style's content."""
    description: str

    def render(self, item: ArithItem) -> str:
        """This style's response to ``item`` (without <eos>)."""
        if self.name == "careful":
            chain = item.solution.split(". \\boxed{")[0]
            return f"{self.marker}{chain}. \\boxed{{{item.answer}}}"
        if self.name == "draft":
            return f"{self.marker}{DRAFT_TEXT}"
        return f"{self.marker}\\boxed{{{item.answer}}}"


DRAFT_TEXT = "work it out one step at a time, then check it."
"""The draft style's whole response: a plan with no number in it, so no answer (reward 0)."""


# A base model mixes strategies: a step-by-step reduction, a shortcut that boxes an answer at once and a
# format failure that never gives one (reward 0). RL on a pool of such samples can only select; the best it
# can reach is the best style alone (the ceiling). No failing style writes a correct arithmetic fact: a
# learner pushes down every token of a failed response, and pushing down correct facts (an earlier build's
# drafts were the careful chain left unboxed, its shortcut boxed the sum of all numbers) wrecked the careful
# style's arithmetic (83% -> 50% right after 30 GGPO updates) instead of selecting it (model card).
#
# The share a style is sampled with and the share of rows that teach it are set apart: a careful chain takes
# far more rows to learn than a constant draft, and with rows in the sampling shares (an earlier build) the
# careful chain stayed flat at temperature 1 (44% right when forced; 70% at temperature 0.3).
STYLES: tuple[Style, ...] = (
    Style("careful", "Careful: ", 0.30, 0.70, "reduces one operation at a time, then boxes the value"),
    Style("quick", "Quick: ", 0.30, 0.20, "boxes the answer at once, without working"),
    Style("draft", "Draft: ", 0.40, 0.10, "states a plan but gives no answer"),
)


def style_of(response: str) -> str:
    """The style a response opened with (its first character decides), or ``other``."""
    for style in STYLES:
        if response[:1] == style.marker[:1]:
            return style.name
    return "other"
