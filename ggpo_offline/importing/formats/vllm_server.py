"""Responses of vLLM's OpenAI-compatible server saved as JSON lines: chat or completions, requested with
``logprobs`` and ``return_token_ids``.

Follows vllm-project/vllm ``entrypoints/openai/chat_completion/protocol.py`` (ChatCompletionResponse:
``prompt_token_ids`` once per response, ``choices[].token_ids``, ``choices[].logprobs.content[].logprob``
one entry per token id) and ``entrypoints/openai/completion/protocol.py`` (``choices[].prompt_token_ids``,
``choices[].logprobs.token_logprobs``). A line is the server's response object, or ``{"response": ...,
"answer": ...}`` to keep each problem's gold answer beside it. The n choices of one prompt are its group.
"""

from collections.abc import Iterator
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.importing.fields import finite, get
from ggpo_offline.importing.imported_response import Rollout
from ggpo_offline.importing.jsonl import json_lines


def rollouts(paths: list[Path]) -> Iterator[Rollout]:
    """Every choice of every saved response, in order."""
    for path in paths:
        for number, line in json_lines(path):
            response = line.get("response", line)
            answer = get(line, "answer", f"{path}:{number}", "key")
            if not isinstance(response, dict) or not isinstance(response.get("choices"), list):
                raise UserError(f"{path}:{number}: no 'choices' list: not a vLLM server response")
            for position, choice in enumerate(response["choices"]):
                yield _choice(response, choice, f"{path}:{number}:choice {position}", answer)


def _choice(response: dict, choice: dict, where: str, answer: str | int | None) -> Rollout:
    chat = "message" in choice
    prompt_ids = get(response if chat else choice, "prompt_token_ids", where, "ids")
    token_ids = get(choice, "token_ids", where, "ids")
    logprobs = choice.get("logprobs")
    values = None
    if isinstance(logprobs, dict):
        if chat:
            values = [get(entry, "logprob", where, "number", True) for entry in logprobs.get("content") or []]
        else:
            values = logprobs.get("token_logprobs")
            if isinstance(values, list) and any(value is None for value in values):
                raise UserError(f"{where}: logprobs.token_logprobs holds null: no log-prob for a token")
            values = get({"token_logprobs": values}, "token_logprobs", where, "floats")
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    return Rollout(
        where=where,
        prompt=response.get("prompt_text") if chat else None,
        prompt_token_ids=prompt_ids,
        response=text if isinstance(text, str) else None,
        response_token_ids=token_ids,
        behavior_logprobs=finite(values, "logprobs", where),
        answer=None if answer is None else str(answer),
        record_id=f"{response.get('id')}/{choice.get('index')}" if response.get("id") else None,
        finish_reason=choice.get("finish_reason"),
    )
