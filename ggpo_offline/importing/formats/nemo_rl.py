"""NeMo-RL's per-step training dump, ``train_data_step{N}.jsonl``.

Follows NVIDIA-NeMo/RL@7ea279ab ``nemo_rl/utils/logger.py`` (``Logger.log_batched_dict_as_jsonl``: one
sample per line, every value inside a one-element list) and ``nemo_rl/algorithms/grpo.py`` (``grpo_train``:
``content`` [prompt text, response text], ``token_ids`` prompt + response right-padded, ``token_loss_mask``
1 on generated tokens, ``generation_logprobs`` the engine's log-prob at each generated token's own position
and 0 elsewhere, ``rewards``). The samples of one prompt are consecutive lines with equal prompt tokens.
"""

from collections.abc import Iterator
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.importing.fields import finite, get
from ggpo_offline.importing.formats.masked import split_sequence
from ggpo_offline.importing.imported_response import Rollout
from ggpo_offline.importing.jsonl import json_lines


def rollouts(paths: list[Path]) -> Iterator[Rollout]:
    """Every sample of every step file, in order."""
    for path in paths:
        for number, line in json_lines(path):
            yield _sample(line, f"{path}:{number}")


def _sample(line: dict, where: str) -> Rollout:
    record = {key: _unwrap(value, key, where) for key, value in line.items() if key != "idx"}
    token_ids = get(record, "token_ids", where, "ids", required=True)
    mask = get(record, "token_loss_mask", where, "ids", required=True)
    logprobs = finite(get(record, "generation_logprobs", where, "floats"), "generation_logprobs", where)
    length = get(record, "input_lengths", where, "number")
    if length is not None:  # drop the right padding, which the mask also leaves out
        token_ids, mask = token_ids[: int(length)], mask[: int(length)]
        logprobs = None if logprobs is None else logprobs[: int(length)]
    prompt_ids, response_ids, response_logprobs = split_sequence(
        token_ids, mask, logprobs, where, "token_loss_mask"
    )
    content = record.get("content")
    texts = content if isinstance(content, list) and len(content) == 2 else [None, None]
    return Rollout(
        where=where,
        prompt=texts[0] if isinstance(texts[0], str) else None,
        prompt_token_ids=prompt_ids,
        response=texts[1] if isinstance(texts[1], str) else None,
        response_token_ids=response_ids,
        behavior_logprobs=response_logprobs,
        reward=get(record, "rewards", where, "number"),
    )


def _unwrap(value, key: str, where: str):
    """The one sample's value: the writer slices a batch of one, so each value is a one-element list."""
    if not isinstance(value, list) or len(value) != 1:
        raise UserError(f"{where}: field '{key}' is not a one-element list: not a NeMo-RL train_data line")
    return value[0]
