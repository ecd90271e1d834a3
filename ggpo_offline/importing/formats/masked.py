"""Cut a full token sequence with a loss mask into prompt and response (NeMo-RL, prime-rl)."""

from ggpo_offline.core.errors import UserError


def split_sequence(
    token_ids: list[int], mask: list, logprobs: list[float] | None, where: str, mask_key: str
) -> tuple[list[int], list[int], list[float] | None]:
    """(prompt ids, response ids, response log-probs) of a single-turn sample whose ``mask`` is true on the
    generated tokens: the prompt is everything before the first of them, the response the one span of them.
    A sample with several generated spans (a multi-turn or tool-use episode) has no single response."""
    if len(mask) != len(token_ids) or (logprobs is not None and len(logprobs) != len(token_ids)):
        lengths = f"{len(token_ids)} token ids, {len(mask)} {mask_key}" + (
            "" if logprobs is None else f", {len(logprobs)} log-probs"
        )
        raise UserError(f"{where}: {lengths}: they must align position by position")
    generated = [position for position, flag in enumerate(mask) if flag]
    if not generated:
        raise UserError(f"{where}: {mask_key} marks no generated token")
    start, end = generated[0], generated[-1] + 1
    if len(generated) != end - start:
        raise UserError(
            f"{where}: {mask_key} marks several generated spans (a multi-turn sample): one response per "
            "sample is imported"
        )
    if start == 0:
        raise UserError(f"{where}: {mask_key} marks the first token as generated: no prompt")
    return token_ids[:start], token_ids[start:end], None if logprobs is None else logprobs[start:end]
