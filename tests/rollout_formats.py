"""A pool written out as each framework writes its rollouts, for the import tests: the layouts follow the
frameworks' own code (cited per writer), the values come from the pool."""

import json
from pathlib import Path

import pyarrow.parquet as pq


def pool_groups(pool: Path) -> list[list[dict]]:
    """The pool's rows, group by group."""
    groups: dict[int, list[dict]] = {}
    for row in pq.read_table(pool).to_pylist():
        groups.setdefault(row["group_id"], []).append(row)
    return list(groups.values())


def _write_lines(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def write_generic(pool: Path, folder: Path) -> list[Path]:
    """The documented generic record, every optional field given."""
    fields = ("prompt", "prompt_token_ids", "response", "response_token_ids", "behavior_logprobs", "reward")
    records = [
        {name: row[name] for name in fields}
        | {
            "answer": row["answer"],
            "group": row["group_id"],
            "id": f"{row['group_id']}/{row['sample_idx']}",
            "prompt_id": row["prompt_id"],
            "source": row["source"],
            "finish_reason": row["finish_reason"],
        }
        for group in pool_groups(pool)
        for row in group
    ]
    return [_write_lines(folder / "rollouts.jsonl", records)]


def write_verl(pool: Path, folder: Path) -> list[Path]:
    """verl's rollout dump (`trainer.rollout_data_dir`), text only: volcengine/verl@00401103
    verl/trainer/ppo/ray_trainer.py, RayPPOTrainer._log_rollout_data and _dump_generations: one
    `{global_steps}.jsonl` per step, a line per response with `input` and `output` (the prompt and response
    ids decoded with skip_special_tokens=True: for the plain template, the pool's texts), `gts` (the
    reward model's ground truth), `score` (the summed token-level scores) and `step`."""
    records = [
        {
            "input": row["prompt"],
            "output": row["response"],
            "gts": row["answer"],
            "score": row["reward"],
            "step": 1,
        }
        for group in pool_groups(pool)
        for row in group
    ]
    return [_write_lines(folder / "1.jsonl", records)]


def write_vllm_completions(pool: Path, folder: Path) -> list[Path]:
    """One saved /v1/completions response per group (n = m, logprobs 0, return_token_ids), with the gold
    beside it. Layout: vllm-project/vllm entrypoints/openai/completion/protocol.py (CompletionResponse,
    CompletionResponseChoice: token_ids and prompt_token_ids per choice; CompletionLogProbs)."""
    lines = []
    for number, group in enumerate(pool_groups(pool)):
        choices = [
            {
                "index": row["sample_idx"],
                "text": row["response"],
                "logprobs": {
                    "text_offset": list(range(len(row["response_token_ids"]))),
                    "token_logprobs": row["behavior_logprobs"],
                    "tokens": [f"token_id:{t}" for t in row["response_token_ids"]],
                    "top_logprobs": [None] * len(row["response_token_ids"]),
                },
                "finish_reason": row["finish_reason"],
                "stop_reason": None,
                "token_ids": row["response_token_ids"],
                "prompt_logprobs": None,
                "prompt_token_ids": row["prompt_token_ids"],
            }
            for row in group
        ]
        response = {"id": f"cmpl-{number}", "object": "text_completion", "model": "m", "choices": choices}
        lines.append({"response": response, "answer": group[0]["answer"]})
    return [_write_lines(folder / "responses.jsonl", lines)]


def write_vllm_chat(pool: Path, folder: Path) -> list[Path]:
    """One saved /v1/chat/completions response per group (n = m, logprobs true, return_token_ids), with the
    gold beside it. Layout: vllm-project/vllm entrypoints/openai/chat_completion/protocol.py
    (ChatCompletionResponse: prompt_token_ids once per response; choices[].token_ids; logprobs.content, one
    entry per token id)."""
    lines = []
    for number, group in enumerate(pool_groups(pool)):
        choices = [
            {
                "index": row["sample_idx"],
                "message": {"role": "assistant", "content": row["response"], "reasoning": None},
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(row["response_token_ids"], row["behavior_logprobs"], strict=True)
                    ]
                },
                "finish_reason": row["finish_reason"],
                "stop_reason": None,
                "token_ids": row["response_token_ids"],
            }
            for row in group
        ]
        response = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "model": "m",
            "choices": choices,
            "prompt_logprobs": None,
            "prompt_token_ids": group[0]["prompt_token_ids"],
        }
        lines.append({"response": response, "answer": group[0]["answer"]})
    return [_write_lines(folder / "chat.jsonl", lines)]


def write_trl(pool: Path, folder: Path, groups_per_call: int = 3) -> list[Path]:
    """rollout_func outputs, one call per line: huggingface/trl@f2cd5771 trl/trainer/grpo_trainer.py
    (RolloutFunc: prompt_ids, completion_ids, logprobs per row; a prompt's num_generations rows consecutive;
    extra keys go to the reward functions)."""
    groups, lines = pool_groups(pool), []
    for start in range(0, len(groups), groups_per_call):
        rows = [row for group in groups[start : start + groups_per_call] for row in group]
        lines.append(
            {
                "prompts": [row["prompt"] for row in rows],
                "prompt_ids": [row["prompt_token_ids"] for row in rows],
                "completion_ids": [row["response_token_ids"] for row in rows],
                "logprobs": [row["behavior_logprobs"] for row in rows],
                "completions": [row["response"] for row in rows],
                "answer": [row["answer"] for row in rows],
            }
        )
    return [_write_lines(folder / "rollouts.jsonl", lines)]


def write_nemo_rl(pool: Path, folder: Path, pad_id: int = 0) -> list[Path]:
    """train_data_step1.jsonl: NVIDIA-NeMo/RL@7ea279ab nemo_rl/utils/logger.py log_batched_dict_as_jsonl
    (one sample per line, each value a one-element list, right-padded to the batch's longest sequence) and
    nemo_rl/algorithms/grpo.py grpo_train (content, rewards, input_lengths, token_ids, token_loss_mask,
    sample_loss_mask, advantages, generation_logprobs at each token's own position, prev_logprobs)."""
    rows = [row for group in pool_groups(pool) for row in group]
    width = max(len(r["prompt_token_ids"]) + len(r["response_token_ids"]) for r in rows)
    lines = []
    for index, row in enumerate(rows):
        prompt, response = row["prompt_token_ids"], row["response_token_ids"]
        pad = width - len(prompt) - len(response)
        generated = [0.0] * len(prompt) + row["behavior_logprobs"] + [0.0] * pad
        lines.append(
            {
                "content": [[row["prompt"], row["response"]]],
                "rewards": [row["reward"]],
                "input_lengths": [len(prompt) + len(response)],
                "token_ids": [prompt + response + [pad_id] * pad],
                "token_loss_mask": [[0] * len(prompt) + [1] * len(response) + [0] * pad],
                "sample_loss_mask": [1.0],
                "advantages": [[0.5] * width],
                "generation_logprobs": [generated],
                "prev_logprobs": [[0.0] + generated[1:]],
                "idx": index,
            }
        )
    return [_write_lines(folder / "train_data_step1.jsonl", lines)]


def write_prime_rl(pool: Path, folder: Path) -> list[Path]:
    """token_exports/step_1/rank_{0,1}.jsonl and rollouts/step_1/train/effective/traces.jsonl:
    PrimeIntellect-ai/prime-rl@559b4477 src/prime_rl/trainer/rl/token_export.py TokenExporter.export (flat
    token_ids, loss_mask, inference_logprobs 0 off the sampled tokens) and src/prime_rl/monitors/file.py
    log_episodes with verifiers@a60a606e verifiers/v1/episode.py (group.id, traces[].nodes, rewards). The
    two ranks split the groups, as data-parallel ranks do; the traces list every episode."""
    exports: dict[int, list[dict]] = {0: [], 1: []}
    episodes = []
    for number, group in enumerate(pool_groups(pool)):
        group_id = f"00000000-0000-4000-8000-{number:012d}"
        for row in group:
            prompt, response = row["prompt_token_ids"], row["response_token_ids"]
            rank = number % 2
            exports[rank].append(
                {
                    "schema_version": 1,
                    "step": 1,
                    "rank": rank,
                    "micro_step": 0,
                    "micro_sequence_idx": len(exports[rank]),
                    "export_sequence_idx": len(exports[rank]),
                    "env_name": "arith",
                    "token_ids": prompt + response,
                    "position_ids": list(range(len(prompt) + len(response))),
                    "loss_mask": [False] * len(prompt) + [True] * len(response),
                    "advantages": [0.0] * len(prompt) + [0.5] * len(response),
                    "inference_logprobs": [0.0] * len(prompt) + row["behavior_logprobs"],
                }
            )
            user = {"message": {"role": "user", "content": row["prompt"]}, "sampled": False}
            assistant = {
                "parent": 0,
                "message": {"role": "assistant", "content": row["response"]},
                "sampled": True,
            }
            episodes.append(
                {
                    "id": f"episode-{number}-{row['sample_idx']}",
                    "env": {"id": "arith", "name": "arith"},
                    "group": {"id": group_id},
                    "run": {"type": "train", "id": "run-1", "work": {"type": "train", "step": 1}},
                    "ok": True,
                    "traces": [
                        {
                            "nodes": [
                                user | {"token_ids": prompt, "mask": [False] * len(prompt), "logprobs": []},
                                assistant
                                | {
                                    "token_ids": response,
                                    "mask": [True] * len(response),
                                    "logprobs": row["behavior_logprobs"],
                                },
                            ],
                            "rewards": {"correct": {"score": row["reward"], "weight": 1.0}},
                        }
                    ],
                }
            )
    files = [_write_lines(folder / f"token_exports/step_1/rank_{r}.jsonl", exports[r]) for r in (0, 1)]
    return files + [_write_lines(folder / "rollouts/step_1/train/effective/traces.jsonl", episodes)]


WRITERS = {
    "generic": write_generic,
    "vllm": write_vllm_completions,
    "trl": write_trl,
    "nemo-rl": write_nemo_rl,
    "prime-rl": write_prime_rl,
}
