"""prime-rl's token exports joined with its rollout traces.

Follows PrimeIntellect-ai/prime-rl@559b4477 ``src/prime_rl/trainer/rl/token_export.py``
(``TokenExporter.export``: ``token_exports/step_{n}/rank_{r}.jsonl``, one line per sample: the flat
``token_ids``, ``loss_mask`` true on sampled tokens, ``inference_logprobs`` the engine's log-prob at each
sampled token's position and 0 elsewhere; no reward, no group) and ``src/prime_rl/monitors/file.py``
(``FileMonitor.log_episodes``: ``rollouts/step_{n}/train/effective/traces.jsonl``, one episode per line,
schema PrimeIntellect-ai/verifiers@a60a606e ``verifiers/v1/episode.py``: ``group.id``, ``traces[].nodes[]``
with ``token_ids`` and ``parent``, ``traces[].rewards{name: {score, weight}}``). An exported sample is
matched to the trace branch of the same step with the same tokens; its reward is the trace's weighted score
sum and its group the episode's group id. Give the export files and the traces files together.
"""

import hashlib
import re
from collections import defaultdict, deque
from collections.abc import Iterator
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.importing.fields import finite, get
from ggpo_offline.importing.formats.masked import split_sequence
from ggpo_offline.importing.imported_response import Rollout
from ggpo_offline.importing.jsonl import json_lines

STEP_FOLDER = re.compile(r"^step_(\d+)$")


def rollouts(paths: list[Path]) -> Iterator[Rollout]:
    """Every exported sample, in the order of the export files, with its trace's reward and group."""
    traces = [path for path in paths if path.name == "traces.jsonl"]
    exports = [path for path in paths if path.name != "traces.jsonl"]
    if not traces or not exports:
        raise UserError(
            "prime-rl: give both the token export files (token_exports/step_N/rank_R.jsonl) and the rollout "
            "traces (rollouts/step_N/train/effective/traces.jsonl): rewards and groups are only in the traces"
        )
    branches = _branches(traces)
    for path in exports:
        for number, record in json_lines(path):
            where = f"{path}:{number}"
            step = get(record, "step", where, "number", required=True)
            token_ids = get(record, "token_ids", where, "ids", required=True)
            mask = get(record, "loss_mask", where, "any", required=True)
            logprobs = get(record, "inference_logprobs", where, "floats")
            matches = branches.get((int(step), _digest(token_ids)))
            if not matches:
                raise UserError(f"{where}: no trace of step {step} has these tokens (give its traces.jsonl)")
            prompt_ids, response_ids, response_logprobs = split_sequence(
                token_ids, mask, finite(logprobs, "inference_logprobs", where), where, "loss_mask"
            )
            reward, group, episode = matches.popleft()  # identical samples: one trace each, in order
            yield Rollout(
                where=where,
                prompt_token_ids=prompt_ids,
                response_token_ids=response_ids,
                behavior_logprobs=response_logprobs,
                reward=reward,
                group=group,
                record_id=f"{step}/{episode}",
            )


def _branches(paths: list[Path]) -> dict[tuple[int, str], deque[tuple[float, str, str]]]:
    """(step, digest of a branch's tokens) -> (the trace's reward, the episode's group id, episode id) of
    every branch with those tokens, in file order."""
    found: dict[tuple[int, str], deque] = defaultdict(deque)
    for path in paths:
        for number, episode in json_lines(path):
            where = f"{path}:{number}"
            step = _step(episode, path, where)
            group = get(episode.get("group") or {}, "id", f"{where}: group", "key", required=True)
            for trace in episode.get("traces") or []:
                rewards = trace.get("rewards") or {}
                reward = sum(
                    float(r.get("score", 0.0)) * float(r.get("weight", 1.0)) for r in rewards.values()
                )
                for tokens in _branch_tokens(trace.get("nodes") or [], where):
                    found[(step, _digest(tokens))].append((reward, str(group), str(episode.get("id"))))
    return found


def _branch_tokens(nodes: list[dict], where: str) -> list[list[int]]:
    """Each root-to-leaf branch's tokens: the concatenated ``token_ids`` of its nodes."""
    parents = {index: node.get("parent") for index, node in enumerate(nodes)}
    leaves = [index for index in parents if index not in parents.values()]
    branches = []
    for leaf in leaves:
        chain, node = [], leaf
        while node is not None:
            chain.append(node)
            node = parents[node]
        tokens = []
        for index in reversed(chain):
            tokens += get(nodes[index], "token_ids", f"{where}: node {index}", "ids", required=True)
        branches.append(tokens)
    return branches


def _step(episode: dict, path: Path, where: str) -> int:
    """The batch step of an episode: ``run.work.step``, else the ``step_N`` folder it was written in."""
    step = ((episode.get("run") or {}).get("work") or {}).get("step")
    if isinstance(step, int):
        return step
    for part in reversed(path.parts):
        if match := STEP_FOLDER.match(part):
            return int(match.group(1))
    raise UserError(f"{where}: no run.work.step and no step_N folder: which step is this episode of?")


def _digest(tokens: list[int]) -> str:
    return hashlib.blake2b(repr(tokens).encode(), digest_size=16).hexdigest()
