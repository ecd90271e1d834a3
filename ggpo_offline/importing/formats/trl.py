"""The output of TRL GRPOTrainer's ``rollout_func`` saved as JSON lines, one call per line.

Follows huggingface/trl@f2cd5771 ``trl/trainer/grpo_trainer.py`` (``RolloutFunc``; ``_generate`` and
``_generate_and_score_completions``): lists indexed by row, ``prompt_ids`` and ``completion_ids`` unpadded,
``logprobs`` one float per completion token; the ``num_generations`` completions of a prompt are
consecutive rows; every other key is what the reward functions receive. The gold answer is read from the
first of ``answer``, ``solution`` or ``ground_truth``, a reward from ``reward`` or ``rewards``, the texts
from ``prompts`` and ``completions`` when they are strings.
"""

from collections.abc import Iterator
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.importing.fields import finite, get
from ggpo_offline.importing.imported_response import Rollout
from ggpo_offline.importing.jsonl import json_lines

GOLD_KEYS = ("answer", "solution", "ground_truth")


def rollouts(paths: list[Path]) -> Iterator[Rollout]:
    """Every row of every saved rollout_func output, in order."""
    for path in paths:
        for number, call in json_lines(path):
            where = f"{path}:{number}"
            for key in ("prompt_ids", "completion_ids"):
                if not isinstance(call.get(key), list):
                    raise UserError(f"{where}: field '{key}' is missing: not a rollout_func output")
            rows = len(call["completion_ids"])
            for key, values in call.items():  # every list is one value per row (logprobs may be null)
                if isinstance(values, list) and len(values) != rows:
                    raise UserError(f"{where}: '{key}' has {len(values)} rows, completion_ids {rows}")
            for row in range(rows):
                yield _row(call, row, f"{where}:row {row}")


def _row(call: dict, row: int, where: str) -> Rollout:
    def at(key: str):
        values = call.get(key)
        return values[row] if isinstance(values, list) else values

    record = {key: at(key) for key in call}
    gold = next((record[key] for key in GOLD_KEYS if record.get(key) is not None), None)
    reward = record.get("reward", record.get("rewards"))
    prompt, completion = record.get("prompts"), record.get("completions")
    return Rollout(
        where=where,
        prompt=prompt if isinstance(prompt, str) else None,
        prompt_token_ids=get(record, "prompt_ids", where, "ids", required=True),
        response=completion if isinstance(completion, str) else None,
        response_token_ids=get(record, "completion_ids", where, "ids", required=True),
        behavior_logprobs=finite(get(record, "logprobs", where, "floats"), "logprobs", where),
        reward=get({"reward": reward}, "reward", where, "number"),
        answer=None if gold is None else str(gold),
    )
