"""One imported response as every format reader yields it, before tokenizing, grouping and scoring."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Rollout:
    """A response with what its source file says about it; None where the format does not carry a field.

    A reader fills what its format holds and leaves the rest to the importer: text is tokenized with
    ``--model``'s tokenizer when ids are missing, ids are decoded when text is missing, rewards are verified
    when a gold answer is given, and behaviour log-probs are re-scored on request."""

    where: str
    """``file:line`` (or ``file:line:choice``): how error messages name the record."""
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    response: str | None = None
    response_token_ids: list[int] | None = None
    behavior_logprobs: list[float] | None = None
    """log μ of each response token, aligned 1:1 with ``response_token_ids``."""
    reward: float | None = None
    answer: str | None = None
    """The gold answer, when the source keeps it: the reward is then verified."""
    group: str | int | None = None
    """Key of the prompt's group when the source names it; otherwise groups are equal prompts."""
    record_id: str | None = None
    """The source's own id of this response (a repeat means a duplicated row)."""
    prompt_id: str | None = None
    source: str | None = None
    finish_reason: str | None = None
