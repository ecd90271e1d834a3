"""The settings of `ggpo pool import`."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ggpo_offline.core.settings import FRACTION, above, at_least, check_relations, check_settings, setting
from ggpo_offline.generate.rewards import AnswerRule
from ggpo_offline.importing.formats import ImportFormat


@dataclass(frozen=True)
class ImportConfig:
    """How ``ggpo pool import`` reads rollouts other tools wrote and what it recomputes."""

    format: ImportFormat = setting(
        help="Layout of the files: generic, nemo-rl, prime-rl, trl (rollout_func output) or vllm (server "
        "responses).",
        flag="from",
    )
    model: str = setting(
        help="Model folder the rollouts were sampled from: its tokenizer reads texts and ids, its weights "
        "re-score log-probs (the pool's model)."
    )
    out: Path = setting(help="Pool file to write.")
    overwrite: bool = setting(False, "Replace an existing --out file.")
    fields: tuple[str, ...] = setting(
        (),
        "NAME=KEY: read the generic record's field NAME from the key KEY (repeat; --from generic), e.g. "
        "verl's rollout dumps: prompt=input, response=output, answer=gts, reward=score.",
        flag="field",
        repeat=True,
    )
    reward_from: Literal["auto", "verify", "file"] = setting(
        "auto",
        "verify: score each response against its gold answer; file: take the file's 0/1 rewards; auto: "
        "verify where every record has a gold answer, else the file's.",
    )
    answer_rule: AnswerRule = setting("math-verify", "How a verified answer is compared with the gold.")
    rescore_behavior: bool = setting(
        False,
        "Compute the behaviour log-probs under --model at --temperature instead of reading them (needed "
        "for text-only sources; the ratios then measure the learner against --model, not the sampler).",
    )
    temperature: float = setting(
        1.0, "Temperature the rollouts were sampled at, as you state it.", valid=above(0)
    )
    top_p: float = setting(
        1.0, "Top-p they were sampled with (below 1: train refuses the pool unless told).", valid=FRACTION
    )
    top_k: int = setting(0, "Top-k they were sampled with (0: none).", valid=at_least(0))
    logprobs_mode: str = setting(
        "processed_logprobs",
        "What the stored log-probs are of: vLLM's --logprobs-mode on the sampler (processed_logprobs: the "
        "distribution sampled from; raw_logprobs, vLLM's default: before temperature and top-p).",
    )
    max_tokens: int | None = setting(
        None,
        "Response length limit the sampler used [default: the longest imported response]; a text that "
        "long without a finish reason was cut there (no EOS appended).",
        valid=at_least(1),
    )
    template: Literal["auto", "chat", "plain"] = setting(
        "auto", "Prompt template `ggpo eval` uses with this model (auto: chat when the tokenizer has one)."
    )
    m: int | None = setting(
        None,
        "Keep the first m responses of each group and drop groups with fewer [default: every group must "
        "have the same size].",
        valid=at_least(1),
    )
    check_samples: int = setting(
        64,
        "Responses re-scored under --model to check the stored log-probs (0: no check).",
        valid=at_least(0),
    )
    reward_workers: int = setting(2, "Processes verifying answers (0: in this process).", valid=at_least(0))

    def __post_init__(self) -> None:
        check_settings(self)
        check_relations(
            [
                (
                    not self.fields or self.format == "generic",
                    f"--field renames the generic record's fields; --from {self.format} has its own",
                ),
                (
                    not self.rescore_behavior or (self.top_p == 1 and self.top_k == 0),
                    "--rescore-behavior computes full-vocabulary log-probs, which cannot be a truncated "
                    "sampler's (--top-p < 1 or --top-k > 0)",
                ),
            ]
        )
