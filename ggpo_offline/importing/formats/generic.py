"""The documented generic record: one response per JSON line or Parquet row (README, "Bring your own
rollouts")."""

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from ggpo_offline.core.errors import UserError
from ggpo_offline.importing.fields import finite, get
from ggpo_offline.importing.imported_response import Rollout
from ggpo_offline.importing.jsonl import json_lines

FIELDS = {
    "prompt": "the prompt text (or prompt_token_ids, or both)",
    "prompt_token_ids": "the prompt's token ids under --model's tokenizer",
    "response": "the response text (or response_token_ids, or both)",
    "response_token_ids": "the response's token ids, ending with the EOS id when the response stopped",
    "behavior_logprobs": "log μ of each response token, one per response token id (optional)",
    "reward": "0 or 1 (optional; verified from answer when that is given)",
    "answer": "the gold answer (optional)",
    "group": "key of the response's group (optional; default: responses to the same prompt)",
    "id": "the response's own id (optional; a repeated id is refused as a duplicated row)",
    "prompt_id": "the problem's id (optional)",
    "source": "the problem's source, e.g. a benchmark name (optional)",
    "finish_reason": "stop or length (optional; default: stop when the last token is an EOS id)",
}


def rollouts(paths: list[Path], renames: dict[str, str] | None = None) -> Iterator[Rollout]:
    """Every record of the JSON-lines or Parquet files, in order; ``renames`` maps a field to the key that
    holds it (``--field NAME=KEY``)."""
    for path in paths:
        for where, record in _records(path):
            if renames:
                record = record | {name: record.get(key) for name, key in renames.items()}
            yield from_record(record, where)


def field_renames(specs: tuple[str, ...]) -> dict[str, str]:
    """``--field NAME=KEY`` options as {NAME: KEY}; UserError for a malformed or unknown one."""
    renames: dict[str, str] = {}
    for spec in specs:
        name, _, key = spec.partition("=")
        if not name or not key:
            raise UserError(f"--field {spec}: expected NAME=KEY, e.g. --field prompt=input")
        if name not in FIELDS:
            raise UserError(
                f"--field {spec}: {name!r} is not a generic field; choose from {', '.join(FIELDS)}"
            )
        if name in renames:
            raise UserError(f"--field {spec}: {name} is already read from {renames[name]!r}")
        renames[name] = key
    return renames


def _records(path: Path) -> Iterator[tuple[str, dict]]:
    if path.suffix == ".parquet":
        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for record in batch.to_pylist():
                row += 1
                yield f"{path}:row {row}", record
    else:
        for number, record in json_lines(path):
            yield f"{path}:{number}", record


def from_record(record: dict, where: str) -> Rollout:
    """A generic record as a rollout, its fields type-checked."""
    record_id = get(record, "id", where, "key")
    return Rollout(
        where=where,
        prompt=get(record, "prompt", where, "str"),
        prompt_token_ids=get(record, "prompt_token_ids", where, "ids"),
        response=get(record, "response", where, "str"),
        response_token_ids=get(record, "response_token_ids", where, "ids"),
        behavior_logprobs=finite(
            get(record, "behavior_logprobs", where, "floats"), "behavior_logprobs", where
        ),
        reward=get(record, "reward", where, "number"),
        answer=_text(get(record, "answer", where, "key")),
        group=get(record, "group", where, "key"),
        record_id=_text(record_id),
        prompt_id=get(record, "prompt_id", where, "str"),
        source=get(record, "source", where, "str"),
        finish_reason=get(record, "finish_reason", where, "str"),
    )


def _text(value: str | int | None) -> str | None:
    return None if value is None else str(value)
