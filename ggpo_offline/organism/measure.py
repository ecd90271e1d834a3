"""Measuring the tiny model by sampling it: accuracy on arith problems of a split, and its solution styles."""

from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ggpo_offline.generate.arith import ArithItem, Split, arith_items
from ggpo_offline.generate.engines.base import DEFAULT_MAX_TOKENS, Engine, SamplingSettings, prompt_seed
from ggpo_offline.generate.rewards import score_response
from ggpo_offline.organism.ceilings import selection_ceilings
from ggpo_offline.organism.styles import PROMPT_CLASSES, STYLES, prompt_class, style_of
from ggpo_offline.organism.tiny import prompt_ids


@torch.no_grad()
def sample_responses(
    model_dir: Path,
    items: list[ArithItem],
    m: int,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_TOKENS,
    prefix: str = "",
    engine: Engine | None = None,
) -> list[list[str]]:
    """``m`` sampled responses per problem (hf ``generate``, or ``engine`` given ``model_dir``'s weights: one
    started engine serves every checkpoint); a ``prefix`` is forced as their first characters and is part of
    each returned response."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
    prompts = [prompt_ids(tokenizer, item.question) + prefix_ids for item in items]
    if engine is not None:
        engine.load_weights(model_dir)
        sampling = SamplingSettings(m=m, temperature=temperature, max_tokens=max_new_tokens, seed=seed)
        seeds = [prompt_seed(seed, str(index)) for index in range(len(prompts))]
        groups = engine.generate(prompts, seeds, sampling)
        return [[prefix + tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in g] for g in groups]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    torch.manual_seed(seed)
    # Same-length prompts batch together without padding, so no left-padding subtleties arise.
    by_length: dict[int, list[int]] = defaultdict(list)
    for index, ids in enumerate(prompts):
        by_length[len(ids)].append(index)
    responses: list[list[str]] = [[] for _ in items]
    for length in sorted(by_length):
        indices = by_length[length]
        input_ids = torch.tensor([prompts[i] for i in indices for _ in range(m)])
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=temperature,
            top_k=0,  # transformers otherwise applies a hidden top_k=50
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts = tokenizer.batch_decode(output[:, length:], skip_special_tokens=True)
        for row, text in enumerate(texts):
            responses[indices[row // m]].append(prefix + text)
    return responses


def measure_styles(
    model_dir: Path,
    n_problems: int = 256,
    m: int = 8,
    seed: int = 0,
    max_new_tokens: int = DEFAULT_MAX_TOKENS,
    problem_seed: int = 0,
    forced: bool = True,
    split: Split = "validation",
    engine: Engine | None = None,
) -> dict:
    """Each style's share and accuracy, overall, per level and per prompt class; with ``forced``, each style's
    accuracy and response lengths when forced, and the two ceilings of selection.

    Free sampling (temperature 1) on ``n_problems`` arith problems of ``split`` gives mean@m, pass@m and, per
    style (told by a response's first character), its share and accuracy. Forcing a style's marker as the
    first characters and sampling the rest gives its accuracy alone. The **prompt-blind ceiling** is the best
    single style's forced accuracy (what a learner reaches by one choice everywhere); the **prompt-aware
    ceiling** takes the best forced style in each prompt class (what selection conditioned on the prompt can
    reach). ``engine``: a started engine samples instead of hf ``generate`` (`sample_responses`).
    """
    items = arith_items(split, n_problems, problem_seed)
    free = sample_responses(model_dir, items, m, seed, max_new_tokens=max_new_tokens, engine=engine)
    report = {
        "model": str(model_dir),
        "split": split,
        "n_problems": len(items),
        "m": m,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        **_style_scores(items, free),
        "forced": {},
        "forced_by_class": {},
        "lengths": {},
    }
    if not forced:
        return report
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for style in STYLES:
        responses = sample_responses(
            model_dir, items, m, seed, max_new_tokens=max_new_tokens, prefix=style.marker, engine=engine
        )
        scores = _style_scores(items, responses)
        report["forced"][style.name] = scores["accuracy"]
        report["forced_by_class"][style.name] = {
            name: scores["by_class"][name]["accuracy"] for name in scores["by_class"]
        }
        report["lengths"][style.name] = _lengths_by_class(tokenizer, items, responses)
    problems = {name: scores["problems"] for name, scores in report["by_class"].items()}
    return report | selection_ceilings(report["forced_by_class"], problems)


def _lengths_by_class(tokenizer, items: list[ArithItem], responses: list[list[str]]) -> dict:
    """Response lengths in tokens (without <eos>) per prompt class: mean, median, 90th percentile, max."""
    lengths: dict[str, list[int]] = defaultdict(list)
    for item, texts in zip(items, responses, strict=True):
        for text in texts:
            lengths[prompt_class(item.level)].append(
                len(tokenizer(text, add_special_tokens=False)["input_ids"])
            )
    summary = {}
    for name in PROMPT_CLASSES:
        values = sorted(lengths[name])
        if values:
            summary[name] = {
                "mean": sum(values) / len(values),
                "median": values[len(values) // 2],
                "p90": values[min(len(values) - 1, (9 * len(values)) // 10)],
                "max": values[-1],
            }
    return summary


def is_right(response: str, item: ArithItem) -> bool:
    """Whether the response earns reward 1 under the arith pool's and eval's own scorer (answer rule
    number: the last box must hold a plain number equal to the gold)."""
    return score_response(response, item.answer, rule="number").reward == 1.0


def _correct_count(item: ArithItem, responses: list[str]) -> int:
    """How many responses are right (``is_right``)."""
    return sum(is_right(text, item) for text in responses)


def _style_scores(items: list[ArithItem], responses: list[list[str]]) -> dict:
    """Accuracy, pass@m, and per style its share and accuracy: overall, per level and per prompt class."""
    # (style, part) -> [right, total]; a part is "all", a level or a prompt class.
    tally: dict[tuple[str, int | str], list[int]] = defaultdict(lambda: [0, 0])
    problems: dict[int | str, int] = defaultdict(int)
    for item, texts in zip(items, responses, strict=True):
        parts = ("all", item.level, prompt_class(item.level))
        for part in parts:
            problems[part] += 1
        for text in texts:
            right = is_right(text, item)
            for style in (style_of(text), "all"):
                for part in parts:
                    tally[(style, part)][0] += right
                    tally[(style, part)][1] += 1
    solved = sum(_correct_count(item, texts) > 0 for item, texts in zip(items, responses, strict=True))

    def share_and_accuracy(style: str, part: int | str) -> dict:
        right, count = tally[(style, part)]
        return {"share": count / tally[("all", part)][1], "accuracy": right / count if count else None}

    names = [style.name for style in STYLES] + (["other"] if ("other", "all") in tally else [])

    def breakdown(part: int | str) -> dict:
        right, total = tally[("all", part)]
        return {"accuracy": right / total, "problems": problems[part]} | {
            name: share_and_accuracy(name, part) for name in names
        }

    return {
        "accuracy": tally[("all", "all")][0] / tally[("all", "all")][1],
        "pass_at_m": solved / len(items),
        "styles": {name: share_and_accuracy(name, "all") for name in names},
        "by_level": {level: breakdown(level) for level in sorted(p for p in problems if isinstance(p, int))},
        "by_class": {name: breakdown(name) for name in PROMPT_CLASSES if name in problems},
    }
