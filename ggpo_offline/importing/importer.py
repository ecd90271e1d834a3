"""`ggpo pool import`: rollouts other tools wrote, as a validated pool with the provenance of each value."""

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa

from ggpo_offline import __version__
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import (
    eos_token_ids,
    load_tokenizer,
    resolve_model_dir,
    tokenizer_sha256,
    weights_sha256,
)
from ggpo_offline.generate.prompts import resolve_template, template_description
from ggpo_offline.generate.rewards import RewardScorer
from ggpo_offline.generate.rollout import max_positions, reward_description
from ggpo_offline.importing.config import ImportConfig
from ggpo_offline.importing.formats import READERS, generic
from ggpo_offline.importing.groups import Grouping, group_rows
from ggpo_offline.importing.rows import Vocabulary, pool_row
from ggpo_offline.importing.staging import Staging
from ggpo_offline.pool.info import (
    PoolCounts,
    PoolDataset,
    PoolEngine,
    PoolInfo,
    PoolModel,
    PoolReward,
    PoolSampling,
    PoolTemplate,
    PoolTokenizer,
)
from ggpo_offline.pool.schema import SCHEMA_VERSION
from ggpo_offline.pool.writer import PoolWriter, check_output_path

GROUPS_PER_CHUNK = 256
SOURCE_SUFFIXES = (".jsonl", ".json", ".parquet")
RECORDS_PER_REPORT = 10_000
"""How often reading reports progress (a 1M-response import reads for minutes)."""

Progress = Callable[[str, int, int | None], None]
"""``on_progress(stage, done, total)``: records read (total unknown), then groups written of all."""


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote and what the user should know about it."""

    path: Path
    groups: int
    m: int
    responses: int
    warnings: list[str]


def import_pool(
    config: ImportConfig, sources: list[Path], on_progress: Progress | None = None
) -> ImportResult:
    """Read ``sources`` in ``config.format``, group, score and check the rollouts, and write the pool at
    ``config.out`` atomically (nothing is written when a record is refused)."""
    report = on_progress or (lambda stage, done, total: None)
    renames = generic.field_renames(config.fields)
    out = Path(config.out)
    check_output_path(out, config.overwrite)
    files = source_files(sources)
    model_dir = resolve_model_dir(config.model)
    tokenizer = load_tokenizer(model_dir)
    template = resolve_template(tokenizer, config.template)
    vocabulary = Vocabulary(
        tokenizer,
        len(tokenizer),
        frozenset(eos_token_ids(model_dir)),
        max_positions(model_dir),
        template,
        config.max_tokens,
    )
    read = partial(generic.rollouts, renames=renames) if renames else READERS[config.format]
    staging_path = out.with_name(f".{out.name}.{os.getpid()}.staging.arrow")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging = Staging(staging_path)
        for rollout in read(list(files)):
            staging.add(pool_row(rollout, vocabulary, need_logprobs=not config.rescore_behavior))
            if staging.count % RECORDS_PER_REPORT == 0:
                report("reading records", staging.count, None)
        if staging.count == 0:
            raise UserError(f"no rollouts in {', '.join(map(str, files))}")
        staged = staging.close()
        grouping = group_rows(staged, config.m)
        reward_source = _reward_source(config, staged)
        return _write(config, out, staged, grouping, reward_source, model_dir, tokenizer, files, report)
    finally:
        staging_path.unlink(missing_ok=True)


def source_files(sources: list[Path]) -> dict[Path, str]:
    """The files to read, each with its sha256: each source file, and the JSON-lines, JSON and Parquet files
    under each folder (sorted); refused when one is missing or two hold the same bytes."""
    files: list[Path] = []
    for source in map(Path, sources):
        if source.is_dir():
            files += sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES)
        elif source.is_file():
            files.append(source)
        else:
            raise UserError(f"{source}: no such file or folder")
    if not files:
        raise UserError("no source files (give files, or folders holding .jsonl, .json or .parquet files)")
    digests: dict[Path, str] = {}  # in reading order
    seen: dict[str, Path] = {}
    for path in files:
        digest = digests[path] = file_sha256(path)
        if digest in seen:
            raise UserError(
                f"{path} holds the same bytes as {seen[digest]}: its rows would be imported twice"
            )
        seen[digest] = path
    return digests


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _reward_source(config: ImportConfig, staged: pa.Table) -> str:
    """verify or file, as asked, or (auto) verify when every record has a gold answer."""
    answers_missing = staged.column("answer").null_count
    if config.reward_from == "verify" or (config.reward_from == "auto" and answers_missing == 0):
        if answers_missing:
            first = staged.column("answer").is_null().index(True).as_py()
            raise UserError(f"{staged.column('where')[first]}: no gold answer to verify the reward against")
        return "verify"
    rewards = staged.column("reward")
    if rewards.null_count:
        first = rewards.is_null().index(True).as_py()
        raise UserError(f"{staged.column('where')[first]}: no reward and no gold answer to verify one")
    values = rewards.to_numpy(zero_copy_only=False)
    if (bad := np.flatnonzero(~np.isin(values, (0.0, 1.0)))).size:
        raise UserError(
            f"{staged.column('where')[int(bad[0])]}: reward {values[bad[0]]}, expected 0 or 1 (the learners "
            "take verifiable 0/1 rewards)"
        )
    return "file"


def _write(
    config, out, staged, grouping: Grouping, reward_source, model_dir, tokenizer, files, report: Progress
) -> ImportResult:
    """The pool, group chunk by group chunk in pool order, then its metadata; the check on a sample."""
    from ggpo_offline.importing.consistency import check_logprobs
    from ggpo_offline.importing.rescore import Scorer

    needs_model = config.rescore_behavior or config.check_samples > 0
    scorer = Scorer(model_dir, tokenizer.pad_token_id or 0) if needs_model else None
    m, longest, tokens, reward_sum, eos_added = grouping.m, 0, 0, 0.0, 0
    with RewardScorer(config.reward_workers if reward_source == "verify" else 0) as verifier:
        with PoolWriter(out, config.overwrite) as writer:
            for start in range(0, len(grouping.group_ids), GROUPS_PER_CHUNK):
                group_ids = grouping.group_ids[start : start + GROUPS_PER_CHUNK]
                rows = staged.take(
                    pa.array(grouping.order[start * m : (start + len(group_ids)) * m])
                ).to_pylist()
                for position, row in enumerate(rows):
                    _fill(row, int(group_ids[position // m]), position % m, config.format)
                if reward_source == "verify":
                    pairs = [(row["response"], row["answer"]) for row in rows]
                    for row, result in zip(
                        rows, verifier.submit(pairs, config.answer_rule).get(), strict=True
                    ):
                        row["reward"], row["extracted_answer"] = result.reward, result.extracted_answer
                if config.rescore_behavior:
                    for row, values in zip(rows, scorer.logprobs(rows, config.temperature), strict=True):
                        row["behavior_logprobs"] = values
                writer.write_rows(rows)
                longest = max([longest] + [len(row["response_token_ids"]) for row in rows])
                tokens += sum(len(row["response_token_ids"]) for row in rows)
                reward_sum += sum(row["reward"] for row in rows)
                eos_added += sum(row["eos_added"] for row in rows)
                report("writing groups", start + len(group_ids), len(grouping.group_ids))
            check = None
            if config.check_samples > 0 and not config.rescore_behavior:
                sample = np.unique(np.linspace(0, len(grouping.order) - 1, config.check_samples).astype(int))
                rows = staged.take(pa.array(grouping.order[sample])).to_pylist()
                truncation = config.top_p < 1 or config.top_k > 0
                check = check_logprobs(rows, scorer, config.temperature, truncation, config.logprobs_mode)
            counts = PoolCounts(
                groups=len(grouping.group_ids),
                responses=len(grouping.order),
                tokens=tokens,
                mean_reward=reward_sum / len(grouping.order),
            )
            checks = {"consistency": check, "eos_appended_to_texts": eos_added}
            footer = _footer(
                config, model_dir, tokenizer, files, grouping, reward_source, counts, longest, checks
            )
            path = writer.close(footer)
    warnings = [check["warning"]] if check and check["warning"] else []
    return ImportResult(path, len(grouping.group_ids), m, len(grouping.order), warnings)


def _fill(row: dict, group_id: int, sample_idx: int, import_format: str) -> None:
    """The pool columns an import decides: ids, position, and the names a source may leave out."""
    row["group_id"], row["sample_idx"] = group_id, sample_idx
    row["prompt_id"] = (
        row["prompt_id"] or f"imported-{hashlib.sha256(row['group_key'].encode()).hexdigest()[:12]}"
    )
    row["source"] = row["source"] or f"imported:{import_format}"
    row["answer"] = row["answer"] if row["answer"] is not None else ""
    row.setdefault("extracted_answer", None)


def _footer(
    config, model_dir, tokenizer, files, grouping, reward_source, counts, longest, checks
) -> PoolInfo:
    """The pool's footer record: what generate-pool records, with what was read, what was recomputed and
    ``checks`` (the consistency check and the EOS ids appended)."""
    template = resolve_template(tokenizer, config.template)
    return PoolInfo(
        schema_version=SCHEMA_VERSION,
        tool_version=__version__,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        source="imported",
        model=PoolModel(path=str(model_dir), name=config.model, weights_sha256=weights_sha256(model_dir)),
        tokenizer=PoolTokenizer(sha256=tokenizer_sha256(tokenizer), class_name=type(tokenizer).__name__),
        engine=PoolEngine(name=f"imported:{config.format}", version=None),
        dtype="auto",
        sampling=PoolSampling(
            m=grouping.m,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_tokens=config.max_tokens or longest,
            seed=None,
            logprobs_mode="rescored" if config.rescore_behavior else config.logprobs_mode,
        ),
        dataset=PoolDataset(spec=f"imported:{config.format}"),
        prompt_template=PoolTemplate.from_dict(template_description(template)),
        reward=PoolReward(
            answer_rule=config.answer_rule,
            source=reward_source,
            other=reward_description(5.0, [config.answer_rule]) if reward_source == "verify" else {},
        ),
        counts=counts,
        imported={
            "format": config.format,
            "fields": generic.field_renames(config.fields),
            "files": [
                {"path": str(path), "bytes": path.stat().st_size, "sha256": digest}
                for path, digest in files.items()
            ],
            "behavior_logp_source": "rescored" if config.rescore_behavior else "file",
            "reward_source": "verified" if reward_source == "verify" else "imported",
            "group_sizes": {str(size): groups for size, groups in grouping.sizes.items()},
            "dropped_groups": grouping.dropped_groups,
            "dropped_responses": grouping.dropped_responses,
            **checks,
        },
    )
