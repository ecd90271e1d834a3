"""An imported rollout as a pool row: tokenized or decoded with the pool model's tokenizer, and checked."""

from dataclasses import dataclass

from ggpo_offline.core.errors import UserError
from ggpo_offline.generate.prompts import encode_prompt
from ggpo_offline.importing.imported_response import Rollout
from ggpo_offline.pool.validate import FINISH_REASONS


@dataclass(frozen=True)
class Vocabulary:
    """What rows are checked against: the model's tokenizer, its size, its EOS ids and its context."""

    tokenizer: object
    size: int
    eos_ids: frozenset[int]
    max_tokens: int
    """Prompt plus response may not exceed the model's positions (``max_position_embeddings``)."""
    template: str
    """``chat`` or ``plain``: a prompt text is encoded as generate-pool encodes that template's prompts."""
    response_limit: int | None = None
    """The sampler's max_tokens when stated: a text of that many tokens was cut there, not stopped."""


def pool_row(rollout: Rollout, vocabulary: Vocabulary, need_logprobs: bool) -> dict:
    """The pool columns of one rollout (without group id and sample index), plus its group key, source
    position and record id; UserError naming the record for anything the pool cannot hold."""
    where, tokenizer = rollout.where, vocabulary.tokenizer
    prompt_ids = rollout.prompt_token_ids
    if prompt_ids is None:
        if rollout.prompt is None:
            raise UserError(f"{where}: no prompt (neither its text nor its token ids)")
        prompt_ids = encode_prompt(tokenizer, rollout.prompt, vocabulary.template)
    response_ids, eos_added = _response_ids(rollout, vocabulary)
    _check_ids(prompt_ids, "prompt", where, vocabulary)
    _check_ids(response_ids, "response", where, vocabulary)
    text = tokenizer.decode(response_ids, skip_special_tokens=True)
    if rollout.response is not None and rollout.response_token_ids is not None and text != rollout.response:
        raise UserError(
            f"{where}: the response's token ids decode to {_cut(text)} under --model's tokenizer, but its "
            f"text is {_cut(rollout.response)}: the ids come from another tokenizer (or the text was edited)"
        )
    eos_at = [position for position, token in enumerate(response_ids) if token in vocabulary.eos_ids]
    if eos_at and eos_at[0] != len(response_ids) - 1:
        raise UserError(
            f"{where}: the response holds an EOS id at token {eos_at[0]} of {len(response_ids)}: a pool "
            "response ends at its first EOS"
        )
    finish = rollout.finish_reason or ("stop" if eos_at else "length")
    if finish not in FINISH_REASONS:
        raise UserError(f"{where}: finish reason {finish!r}, expected one of {FINISH_REASONS}")
    if len(prompt_ids) + len(response_ids) > vocabulary.max_tokens:
        raise UserError(
            f"{where}: {len(prompt_ids)} prompt + {len(response_ids)} response tokens exceed --model's "
            f"{vocabulary.max_tokens} positions"
        )
    logprobs = _logprobs(rollout, len(response_ids), need_logprobs)
    return {
        "prompt": rollout.prompt if rollout.prompt is not None else _prompt_text(tokenizer, prompt_ids),
        "prompt_token_ids": prompt_ids,
        "answer": rollout.answer,
        "response": rollout.response if rollout.response is not None else text,
        "response_token_ids": response_ids,
        "behavior_logprobs": logprobs,
        "finish_reason": finish,
        "reward": rollout.reward,
        "prompt_id": rollout.prompt_id,
        "source": rollout.source,
        "group": None if rollout.group is None else str(rollout.group),
        "group_is_int": isinstance(rollout.group, int),
        "record_id": rollout.record_id,
        "where": where,
        "eos_added": eos_added,
    }


def _response_ids(rollout: Rollout, vocabulary: Vocabulary) -> tuple[list[int], bool]:
    """The response's token ids, and whether an EOS was appended to a text: a text ended where the model
    stopped, unless the source says it was cut at the length limit, or it reaches that limit (a stopped
    response has room for its EOS)."""
    if rollout.response_token_ids is not None:
        return rollout.response_token_ids, False
    if rollout.response is None:
        raise UserError(f"{rollout.where}: no response (neither its text nor its token ids)")
    tokenizer, limit = vocabulary.tokenizer, vocabulary.response_limit
    ids = tokenizer(rollout.response, add_special_tokens=False)["input_ids"]
    cut = rollout.finish_reason == "length" or (
        rollout.finish_reason is None and limit is not None and len(ids) >= limit
    )
    return (ids if cut else [*ids, tokenizer.eos_token_id]), not cut


def _prompt_text(tokenizer, prompt_ids: list[int]) -> str:
    """The prompt as generate-pool stores it: the template's text, special tokens included, but without the
    BOS token a plain template's tokenizer adds."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return tokenizer.decode(prompt_ids[1:] if bos is not None and prompt_ids[0] == bos else prompt_ids)


def _check_ids(ids: list[int], what: str, where: str, vocabulary: Vocabulary) -> None:
    if not ids:
        raise UserError(f"{where}: the {what} has no tokens")
    outside = [token for token in ids if not 0 <= token < vocabulary.size]
    if outside:
        raise UserError(
            f"{where}: {what} token id {outside[0]} is outside --model's vocabulary ({vocabulary.size} ids): "
            "the rollouts were tokenized by another tokenizer"
        )


def _logprobs(rollout: Rollout, tokens: int, needed: bool) -> list[float] | None:
    """The stored log μ, checked to align 1:1 with the response tokens and to be log-probabilities."""
    values, where = rollout.behavior_logprobs, rollout.where
    if not needed:
        return None
    if values is None:
        raise UserError(
            f"{where}: no behaviour log-probs; pass --rescore-behavior to compute them under --model"
        )
    if len(values) != tokens:
        raise UserError(
            f"{where}: {len(values)} behaviour log-probs for {tokens} response tokens: they must align 1:1"
        )
    positive = [position for position, value in enumerate(values) if value > 0]
    if positive:
        raise UserError(
            f"{where}: behaviour log-prob {values[positive[0]]} > 0 at token {positive[0]}: these are not "
            "log-probabilities (logits? vLLM --logprobs-mode *_logits)"
        )
    return values


def _cut(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
