"""Problems in, scored samples out: the steps shared by pool generation and evaluation."""

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.stopwatch import Stopwatch
from ggpo_offline.generate.engines import Engine, Sample, SamplingSettings, prompt_seed
from ggpo_offline.generate.problems import Problem
from ggpo_offline.generate.prompts import encode_prompt, format_prompt
from ggpo_offline.generate.rewards import (
    ANSWER_RULE_DESCRIPTIONS,
    EXTRACTION_RULE,
    EXTRACTION_RULE_DESCRIPTION,
    AnswerRule,
    RewardResult,
    RewardScorer,
)


@dataclass
class RolloutTotals:
    """Responses scored so far and since when; the progress of generation and of evaluation extend it."""

    responses: int = 0
    reward_sum: float = 0.0
    started: float = field(default_factory=time.monotonic)

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.responses if self.responses else 0.0

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class ScoredBatch:
    """One engine call: its problems, their samples, the decoded responses and the rewards."""

    start: int
    """Position of the batch's first problem in the list given to ``sample_and_score``."""
    problems: list[Problem]
    samples: list[list[Sample]]
    """``m`` samples per problem."""
    responses: list[list[str]]
    """The samples decoded to text (special tokens skipped)."""
    results: list[RewardResult]
    """Rewards, problem-major: problem ``i``'s ``m`` results are ``results[i*m : (i+1)*m]``."""


def encode_prompts(
    tokenizer, problems: list[Problem], template: Literal["chat", "plain"]
) -> tuple[list[str], list[list[int]]]:
    """Each problem's prompt text and token ids."""
    texts = [format_prompt(tokenizer, p.problem, template) for p in problems]
    return texts, [encode_prompt(tokenizer, text, template) for text in texts]


def max_positions(model_dir: Path) -> int:
    """The model's context length (``max_position_embeddings``, 4096 when the config has none)."""
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(str(model_dir)), "max_position_embeddings", 4096))


def prompt_token_limit(model_dir: Path, max_tokens: int) -> int:
    """The longest prompt that leaves room for ``max_tokens`` response tokens; UserError when none does."""
    positions = max_positions(model_dir)
    limit = positions - max_tokens
    if limit < 1:
        raise UserError(f"--max-tokens {max_tokens} leaves no room for a prompt (model: {positions})")
    return limit


def sample_and_score(
    engine: Engine,
    tokenizer,
    scorer: RewardScorer,
    problems: list[Problem],
    prompt_ids: list[list[int]],
    sampling: SamplingSettings,
    batch_prompts: int,
    rule: AnswerRule | Sequence[AnswerRule] = "math-verify",
    stopwatch: Stopwatch | None = None,
) -> Iterator[ScoredBatch]:
    """Sample ``sampling.m`` responses per problem, decode and score them under answer ``rule`` (one for
    all problems, or one per problem), one batch at a time, in order; ``stopwatch`` gets the time spent
    sampling and decoding ("sampling") and waiting for rewards ("scoring").

    Each problem samples from ``prompt_seed(sampling.seed, prompt_id)``, so its responses do not depend
    on batching. The rewards of a batch are computed by the scorer's workers while the engine samples
    the next batch.
    """
    stopwatch = Stopwatch() if stopwatch is None else stopwatch
    pending = None
    for start in range(0, len(problems), batch_prompts):
        batch_problems = problems[start : start + batch_prompts]
        with stopwatch.timing("sampling"):
            samples = engine.generate(
                prompt_ids[start : start + batch_prompts],
                [prompt_seed(sampling.seed, p.prompt_id) for p in batch_problems],
                sampling,
            )
            responses = [
                [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in group] for group in samples
            ]
        pairs = [
            (text, p.answer) for p, group in zip(batch_problems, responses, strict=True) for text in group
        ]
        rules = rule
        if not isinstance(rule, str):  # a problem's rule, once for each of its responses
            rules = [rule[start + i] for i, group in enumerate(responses) for _ in group]
        handle = scorer.submit(pairs, rules)
        if pending is not None:
            yield _scored(*pending, stopwatch)
        pending = (start, batch_problems, samples, responses, handle)
    if pending is not None:
        yield _scored(*pending, stopwatch)


def _scored(start, problems, samples, responses, handle, stopwatch: Stopwatch) -> ScoredBatch:
    with stopwatch.timing("scoring"):  # only what the next batch's sampling did not already cover
        rewards = handle.get()
    return ScoredBatch(start, problems, samples, responses, rewards)


def reward_description(timeout_s: float, rules: Collection[AnswerRule] = ("math-verify",)) -> dict:
    """What a pool's metadata and an evaluation report record about the reward: the extraction, and what
    each answer rule in ``rules`` means."""
    return {
        "extraction_rule": EXTRACTION_RULE,
        "description": EXTRACTION_RULE_DESCRIPTION,
        "answer_rules": {rule: ANSWER_RULE_DESCRIPTIONS[rule] for rule in sorted(set(rules))},
        "verifier": f"math-verify {_package_version('math-verify')}" if "math-verify" in rules else None,
        "timeout_s": timeout_s,
    }


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"
