"""`ggpo pool import`: each framework's layout round-trips a pool exactly, the imported pool trains like the
generated one, the consistency check names a wrong temperature, and hostile input is one error line."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rollout_formats import WRITERS, pool_groups, write_generic, write_verl, write_vllm_chat
from test_cli import assert_one_error_line, ggpo_here

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import tiny_model_dir
from ggpo_offline.importing.config import ImportConfig
from ggpo_offline.importing.importer import import_pool
from ggpo_offline.pool.schema import METADATA_KEY
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.pool.validate import validate_pool

TOKEN_COLUMNS = ("prompt_token_ids", "response_token_ids", "behavior_logprobs", "reward", "finish_reason")


def _config(out: Path, import_format: str = "generic", **changes) -> ImportConfig:
    base = ImportConfig(
        format=import_format, model=str(tiny_model_dir()), out=out, answer_rule="number", reward_workers=0
    )
    return replace(base, **changes)


def _groups(pool: Path) -> list[list[tuple]]:
    """Each group's responses as (token and score columns), groups in any order: the pool up to group ids."""
    return sorted(
        [[tuple(map(_frozen, (row[c] for c in TOKEN_COLUMNS))) for row in g] for g in pool_groups(pool)]
    )


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def _table(pool: Path):
    return pq.read_table(pool).replace_schema_metadata(None)


def _metadata(pool: Path) -> dict:
    return json.loads(pq.ParquetFile(pool).metadata.metadata[METADATA_KEY])


@pytest.mark.parametrize("import_format", list(WRITERS))
def test_each_format_round_trips_the_pool_and_records_where_it_came_from(hf_pool, tmp_path, import_format):
    files = WRITERS[import_format](hf_pool, tmp_path / "source")
    result = import_pool(_config(tmp_path / "pool.parquet", import_format), [tmp_path / "source"])

    assert validate_pool(result.path).groups == len(pool_groups(hf_pool))
    assert _groups(result.path) == _groups(hf_pool)  # token ids, log-probs, rewards, grouping
    if import_format == "generic":  # it carries every column: the very same table
        assert _table(result.path).equals(_table(hf_pool))
    meta = _metadata(result.path)
    assert meta["source"] == "imported" and meta["import"]["format"] == import_format
    assert [f["path"] for f in meta["import"]["files"]] == [str(p) for p in sorted(files)]
    assert meta["import"]["behavior_logp_source"] == "file"
    verified = import_format in ("generic", "trl", "vllm")  # the formats that keep the gold answer
    assert meta["import"]["reward_source"] == ("verified" if verified else "imported")
    check = meta["import"]["consistency"]
    assert check["warning"] is None and check["token_mean_abs_gap"] < 1e-5 and result.warnings == []
    # ggpo train replays it from the pool's model (recorded in the footer): update 0 is on-policy.
    first = _train(result.path, tmp_path / "run", updates=1).metrics[0]
    assert abs(first["mismatch/k3"]) < 1e-6 and abs(first["mismatch/drift"]) < 1e-6


def _train(pool: Path, out: Path, updates: int):
    from ggpo_offline.train.config import TrainConfig
    from ggpo_offline.train.trainer import train

    config = TrainConfig(
        pool=pool, updates=updates, groups_per_batch=2, lr=1e-4, no_tracking=True, out=out, method="ggpo"
    )
    return train(config)


@pytest.mark.parametrize("writer", ["vllm-chat", "trl", "nemo-rl"])
def test_a_chat_pool_of_a_bpe_model_round_trips(rehearsal_dir, rehearsal_pool, tmp_path, writer):
    """The rehearsal model (byte-level BPE, Qwen's special tokens, a chat template, two EOS ids): the chat
    server layout and the id-and-text layouts import back to the same pool, texts and prompts included."""
    write = write_vllm_chat if writer == "vllm-chat" else WRITERS[writer]
    write(rehearsal_pool, tmp_path / "source")
    import_format = "vllm" if writer == "vllm-chat" else writer
    config = _config(tmp_path / "pool.parquet", import_format, model=str(rehearsal_dir))
    result = import_pool(config, [tmp_path / "source"])

    assert _groups(result.path) == _groups(rehearsal_pool)
    for name in ("prompt", "response", "prompt_token_ids"):
        assert _table(result.path).column(name).equals(_table(rehearsal_pool).column(name)), name
    meta = _metadata(result.path)
    assert meta["prompt_template"]["kind"] == "chat" and meta["import"]["consistency"]["warning"] is None


def test_an_imported_pool_trains_exactly_like_the_generated_one(hf_pool, tmp_path, monkeypatch):
    from ggpo_offline.importing import importer

    write_generic(hf_pool, tmp_path / "source")
    monkeypatch.setattr(importer, "RECORDS_PER_REPORT", 24)
    monkeypatch.setattr(importer, "GROUPS_PER_CHUNK", 6)
    reports = []
    config = _config(tmp_path / "pool.parquet")
    imported = import_pool(config, [tmp_path / "source"], on_progress=lambda *r: reports.append(r)).path
    read = [("reading records", n, None) for n in (24, 48)]  # 64 records
    assert reports == read + [("writing groups", n, 16) for n in (6, 12, 16)]
    runs = {
        name: _train(pool, tmp_path / name, updates=2).metrics
        for name, pool in (("generated", hf_pool), ("imported", imported))
    }
    first = runs["imported"][0]
    assert abs(first["mismatch/k3"]) < 1e-6 and abs(first["mismatch/drift"]) < 1e-6  # as the generated pool's
    strip = ("time", "seconds")
    clean = [{k: v for k, v in m.items() if not any(s in k for s in strip)} for m in runs["imported"]]
    assert clean == [
        {k: v for k, v in m.items() if not any(s in k for s in strip)} for m in runs["generated"]
    ]


def test_a_stated_truncated_sampler_is_recorded_and_train_refuses_it_as_for_a_generated_pool(
    hf_pool, tmp_path
):
    write_generic(hf_pool, tmp_path / "source")
    result = import_pool(
        _config(tmp_path / "pool.parquet", top_p=0.9, check_samples=0), [tmp_path / "source"]
    )
    assert _metadata(result.path)["sampling"]["top_p"] == 0.9
    with pytest.raises(
        UserError, match=r"was sampled with top-p 0.9: its behavior log-probs are of the truncated"
    ):
        _train(result.path, tmp_path / "run", updates=1)
    with pytest.raises(
        UserError, match=r"^--rescore-behavior computes full-vocabulary log-probs, which cannot"
    ):
        import_pool(
            _config(tmp_path / "other.parquet", top_p=0.9, rescore_behavior=True), [tmp_path / "source"]
        )


VERL_FIELDS = ("prompt=input", "response=output", "answer=gts", "reward=score")


@pytest.mark.parametrize("layout", ["generic", "verl"])
def test_text_only_rollouts_are_rescored_under_the_model(hf_pool, tmp_path, layout):
    """Records with texts alone: ids come from the tokenizer (EOS appended where the response stopped), and
    --rescore-behavior computes log μ under --model: the fp32 hf pool's own values. verl's dump names the
    fields otherwise (--field) and has no finish reason: a text as long as --max-tokens was cut there."""
    if layout == "verl":
        (source,) = write_verl(hf_pool, tmp_path / "dump")
        settings = {
            "fields": VERL_FIELDS,
            "max_tokens": read_pool_info(hf_pool).raw["sampling"]["max_tokens"],
        }
    else:
        lines = [
            {
                "prompt": r["prompt"],
                "response": r["response"],
                "answer": r["answer"],
                "finish_reason": r["finish_reason"],
            }
            for group in pool_groups(hf_pool)
            for r in group
        ]
        source = tmp_path / "texts.jsonl"
        source.write_text("".join(json.dumps(line) + "\n" for line in lines))
        settings = {}
    with pytest.raises(UserError, match=rf"{source.name}:1: no behaviour log-probs; pass --rescore-behavior"):
        import_pool(_config(tmp_path / "refused.parquet", **settings), [source])
    result = import_pool(_config(tmp_path / "pool.parquet", rescore_behavior=True, **settings), [source])

    imported, original = pq.read_table(result.path), pq.read_table(hf_pool)
    assert set(original.column("finish_reason").to_pylist()) == {"stop", "length"}
    for name in ("prompt_token_ids", "response_token_ids", "reward", "finish_reason"):
        assert imported.column(name).equals(original.column(name)), name
    got = [x for row in imported.column("behavior_logprobs").to_pylist() for x in row]
    want = [x for row in original.column("behavior_logprobs").to_pylist() for x in row]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
    meta = _metadata(result.path)
    assert (
        meta["import"]["behavior_logp_source"] == "rescored"
        and meta["sampling"]["logprobs_mode"] == "rescored"
    )
    assert meta["import"]["consistency"] is None  # nothing stored to check
    assert meta["import"]["fields"] == dict(field.split("=") for field in settings.get("fields", ()))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (("prompt",), "--field prompt: expected NAME=KEY, e.g. --field prompt=input"),
        (
            ("question=input",),
            "--field question=input: 'question' is not a generic field; choose from prompt,",
        ),
        (("prompt=input", "prompt=query"), "--field prompt=query: prompt is already read from 'input'"),
    ],
)
def test_a_bad_field_option_is_refused_before_reading(tmp_path, fields, expected):
    with pytest.raises(UserError, match=re.escape(expected)):
        import_pool(_config(tmp_path / "pool.parquet", fields=fields), [tmp_path / "missing.jsonl"])
    with pytest.raises(
        UserError, match="--field renames the generic record's fields; --from trl has its own"
    ):
        import_pool(_config(tmp_path / "pool.parquet", "trl", fields=("prompt=input",)), [tmp_path])


def test_the_consistency_check_names_the_temperature_the_log_probs_are_of(hf_pool, tmp_path):
    write_generic(hf_pool, tmp_path / "source")
    result = import_pool(_config(tmp_path / "pool.parquet", temperature=0.7), [tmp_path / "source"])
    check = _metadata(result.path)["import"]["consistency"]
    assert check["temperature"] == 0.7 and check["best_temperature"] == 1.0 and check["sequence_ess"] < 0.99
    assert check["token_mean_abs_gap"] > 1000 * check["best_temperature_gap"]
    (warning,) = result.warnings
    assert warning.startswith("the stored log-probs differ from --model's at temperature 0.7 by ")
    assert "; they are --model's at temperature 1.0 (" in warning
    assert "nats per token): vLLM's default --logprobs-mode raw_logprobs gives log-probs before" in warning
    # A pool stated at its own temperature passes.
    fine = import_pool(_config(tmp_path / "fine.parquet"), [tmp_path / "source"])
    assert fine.warnings == [] and _metadata(fine.path)["sampling"]["temperature"] == 1.0


def test_the_consistency_check_tells_a_truncated_sampler_from_another_model(
    rehearsal_dir, other_rehearsal_dir, rehearsal_pool, tmp_path
):
    """A truncated sampler's log-probs exceed the model's at every token; another model's (another seed of
    the rehearsal model) are higher on average too, but not everywhere: the sign test tells them apart."""
    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    nucleus = generate_pool(
        GenerateConfig(
            model=str(rehearsal_dir), template="chat", num_prompts=8, engine="hf", dtype="float32",
            sampling=SamplingSettings(m=8, max_tokens=32, seed=0, top_p=0.8), out=tmp_path / "top-p.parquet",
            reward_workers=0,
        )
    )  # fmt: skip
    write_generic(nucleus, tmp_path / "top-p")
    unstated = import_pool(_config(tmp_path / "a.parquet", model=str(rehearsal_dir)), [tmp_path / "top-p"])
    check = _metadata(unstated.path)["import"]["consistency"]
    assert check["differing_stored_higher"] == 1.0 and check["differing_tokens"] > 100
    (warning,) = unstated.warnings
    assert warning.endswith(
        f"they are higher than --model's at 100% of the {check['differing_tokens']} tokens that differ: a "
        "truncated sampler (top-p or top-k) renormalized them; pass the --top-p/--top-k they were sampled "
        "with"
    )
    stated = import_pool(
        _config(tmp_path / "b.parquet", model=str(rehearsal_dir), top_p=0.8), [tmp_path / "top-p"]
    )
    assert stated.warnings == [] and _metadata(stated.path)["sampling"]["top_p"] == 0.8

    write_generic(rehearsal_pool, tmp_path / "seed-0")
    other = import_pool(
        _config(tmp_path / "c.parquet", model=str(other_rehearsal_dir)), [tmp_path / "seed-0"]
    )
    check = _metadata(other.path)["import"]["consistency"]
    assert check["mean_stored_minus_model"] > 0.05 and 0.5 < check["differing_stored_higher"] < 0.9
    (warning,) = other.warnings
    assert warning.endswith("no temperature fits: another model (or other weights) sampled these rollouts")


def _lines(records: list[dict]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def _hostile(records: list[dict], case: str) -> str:
    """The records as JSON lines, spoilt one way."""
    first = records[0]
    if case == "misaligned log-probs":
        first["behavior_logprobs"] = first["behavior_logprobs"][:-1]
    elif case == "missing prompt":
        del first["prompt"], first["prompt_token_ids"]
    elif case == "NaN log-prob":
        first["behavior_logprobs"][0] = float("nan")
    elif case == "another tokenizer's ids":
        first["response_token_ids"][0] = 151645  # Qwen's <|im_end|>
    elif case == "ids that are not the text":
        first["response"] = "something else"
    elif case == "a 10k-token line":
        first["response_token_ids"] = first["response_token_ids"][:1] * 10_000
        first["behavior_logprobs"] = [-0.5] * 10_000
        first["response"] = first["response"][:1] * 10_000
        first["finish_reason"] = "length"
    elif case == "EOS inside the response":
        first["response_token_ids"] = first["response_token_ids"][-1:] + first["response_token_ids"]
        first["behavior_logprobs"] = [-0.1] + first["behavior_logprobs"]
        first["response"] = first["response"]
    elif case == "a reward that is not 0 or 1":
        for record in records:
            del record["answer"]
        first["reward"] = 0.5
    elif case == "a duplicated row":
        records.append(dict(first))
    elif case == "unequal groups":
        records.pop()
    text = _lines(records)
    return text[: len(text) - 20] if case == "truncated JSON lines" else text


HOSTILE = {  # where the error points (file:line of the record) and what it says
    "misaligned log-probs": r":1: \d+ behaviour log-probs for \d+ response tokens: they must align 1:1",
    "missing prompt": r":1: no prompt \(neither its text nor its token ids\)",
    "NaN log-prob": r":1: field 'behavior_logprobs' holds nan at position 0",
    "another tokenizer's ids": r":1: response token id 151645 is outside --model's vocabulary",
    "ids that are not the text": r":1: the response's token ids decode to .* but its text is 'some",
    "a 10k-token line": r":1: \d+ prompt \+ 10000 response tokens exceed --model's 512 positions",
    "EOS inside the response": r":1: the response holds an EOS id at token 0 of \d+",
    "a reward that is not 0 or 1": r":1: reward 0.5, expected 0 or 1",
    "a duplicated row": r":9: a duplicated row \(the same record as .*rollouts.jsonl:1\)",
    "unequal groups": r"^groups of unequal size \(1 of 3, 1 of 4 responses\): pass --m N",
    "truncated JSON lines": r":8: not a JSON record \(the file ends inside this record \(truncated\)\)",
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_input_is_refused_naming_the_record_and_writes_nothing(hf_pool, tmp_path, case):
    source = tmp_path / "rollouts.jsonl"
    source.write_text(_hostile(_first_records(hf_pool, tmp_path), case))
    out = tmp_path / "out" / "pool.parquet"
    with pytest.raises(UserError, match=HOSTILE[case]):
        import_pool(_config(out), [source])
    assert not out.exists() and list((tmp_path / "out").iterdir()) == []  # no pool, no staging left


def _first_records(pool: Path, tmp_path: Path, groups: int = 2) -> list[dict]:
    """The generic records of the pool's first ``groups`` groups (m = 4: 8 records)."""
    (path,) = write_generic(pool, tmp_path / "all")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    keep = sorted({r["group"] for r in records})[:groups]
    return [r for r in records if r["group"] in keep]


def test_unequal_groups_are_trimmed_to_m_and_the_same_file_twice_is_refused(hf_pool, tmp_path):
    records = _first_records(hf_pool, tmp_path, groups=3)
    records.pop()  # the third group keeps 3 of its 4 responses
    source = tmp_path / "rollouts.jsonl"
    source.write_text(_lines(records))
    result = import_pool(_config(tmp_path / "three.parquet", m=3), [source])
    assert (result.groups, result.m) == (3, 3)
    recorded = _metadata(result.path)["import"]
    assert (recorded["group_sizes"], recorded["dropped_responses"]) == ({"3": 1, "4": 2}, 2)
    result = import_pool(_config(tmp_path / "four.parquet", m=4), [source])
    assert (result.groups, result.m) == (2, 4)
    assert _metadata(result.path)["import"]["dropped_groups"] == 1

    twin = tmp_path / "copy.jsonl"
    twin.write_text(source.read_text())
    with pytest.raises(
        UserError, match=r"copy.jsonl holds the same bytes as .*rollouts.jsonl: its rows would"
    ):
        import_pool(_config(tmp_path / "twice.parquet"), [source, twin])


def test_the_command_prints_one_error_line_and_keeps_an_existing_pool(hf_pool, tmp_path):
    source = tmp_path / "rollouts.jsonl"
    source.write_text(_hostile(_first_records(hf_pool, tmp_path), "another tokenizer's ids"))
    out = tmp_path / "pool.parquet"
    out.write_bytes(b"an earlier pool")
    args = ("pool", "import", "--from", "generic", str(source), "--model", str(tiny_model_dir()))
    result = ggpo_here(*args, "--out", str(out), "--overwrite")  # refused before anything is replaced
    assert_one_error_line(result, "response token id 151645 is outside --model's vocabulary (100 ids)")
    assert out.read_bytes() == b"an earlier pool"
