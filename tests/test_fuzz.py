"""Hostile pools: hypothesis mutates valid pools; every break is one clear error line, never a traceback."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import synthetic_metadata, synthetic_rows, write_synthetic_pool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import ggpo_here

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.schema import METADATA_KEY, POOL_SCHEMA
from ggpo_offline.pool.validate import validate_pool

GROUPS, M = 4, 3
ROWS = GROUPS * M
COLUMNS = POOL_SCHEMA.names
# Fixed example counts, derandomized and without a stored database: every run tries the same cases.
BASE = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def fuzz(examples: int) -> settings:
    return settings(BASE, max_examples=examples)


GGPO = str(Path(sys.executable).parent / "ggpo")


def base_rows() -> list[dict]:
    return synthetic_rows(GROUPS, M, seed=1)


def write_pool(path: Path, table: pa.Table, metadata: bytes | None) -> Path:
    if metadata is not None:
        table = table.replace_schema_metadata({METADATA_KEY: metadata})
    pq.write_table(table, path)
    return path


def good_metadata() -> bytes:
    return json.dumps(synthetic_metadata(M)).encode()


def assert_rejected(path: Path, expected: str) -> str:
    """validate_pool raises a UserError whose one-line message names the file and matches ``expected``."""
    with pytest.raises(UserError) as caught:
        validate_pool(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    assert re.search(expected, message), message
    return message


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory) -> Path:
    """One file name reused by every example (hypothesis runs examples inside one test call)."""
    return tmp_path_factory.mktemp("fuzz") / "pool.parquet"


def test_the_unmutated_pool_is_valid(pool_file):
    table = pa.Table.from_pylist(base_rows(), schema=POOL_SCHEMA)
    assert validate_pool(write_pool(pool_file, table, good_metadata())).rows == ROWS


# --- columns: dropped, retyped, duplicated ------------------------------------------------------------


def _retyped(column: pa.ChunkedArray) -> pa.Array:
    # Strings become integers and everything else becomes strings: always a different Arrow type.
    if column.type == pa.string():
        return pa.array(range(len(column)), pa.int64())
    return pa.array([str(value) for value in column.to_pylist()], pa.string())


@fuzz(40)
@given(column=st.sampled_from(COLUMNS), how=st.sampled_from(["drop", "retype", "duplicate"]))
def test_broken_columns_are_named(pool_file, column, how):
    table = pa.Table.from_pylist(base_rows(), schema=POOL_SCHEMA)
    index = table.schema.get_field_index(column)
    if how == "drop":
        table, expected = table.remove_column(index), f"column '{column}' is missing"
    elif how == "retype":
        table, expected = table.set_column(index, column, _retyped(table.column(column))), "has type"
        expected = f"column '{column}' {expected}"
    else:
        table = table.append_column(pa.field(column, table.schema.field(column).type), table.column(column))
        expected = f"column '{column}' appears 2 times"
    assert_rejected(write_pool(pool_file, table, good_metadata()), expected)


# --- row values: ragged log-probs, bad log-probs, rewards, tokens -------------------------------------

row_index = st.integers(0, ROWS - 1)
bad_logprob = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.floats(min_value=1e-6, max_value=1e30),  # positive: not a log-probability
)
bad_reward = st.one_of(
    st.sampled_from([float("nan"), float("inf"), -1.0, 0.5, 2.0]),
    st.floats(allow_nan=False, width=32).filter(lambda r: r not in (0.0, 1.0)),
)


@fuzz(60)
@given(row=row_index, extra=st.integers(-3, 3).filter(bool))
def test_ragged_logprobs_are_named(pool_file, row, extra):
    rows = base_rows()
    logprobs = rows[row]["behavior_logprobs"]
    rows[row]["behavior_logprobs"] = logprobs + [-0.5] * extra if extra > 0 else logprobs[:extra]
    table = pa.Table.from_pylist(rows, schema=POOL_SCHEMA)
    assert_rejected(
        write_pool(pool_file, table, good_metadata()), rf"row {row}, column 'behavior_logprobs': has"
    )


@fuzz(60)
@given(row=row_index, position=st.integers(0, 11), value=bad_logprob)
def test_non_finite_or_positive_logprobs_are_named(pool_file, row, position, value):
    rows = base_rows()
    logprobs = rows[row]["behavior_logprobs"]
    logprobs[position % len(logprobs)] = value
    table = pa.Table.from_pylist(rows, schema=POOL_SCHEMA)
    message = assert_rejected(
        write_pool(pool_file, table, good_metadata()), rf"row {row}, column 'behavior_logprobs'"
    )
    assert "must be finite and <= 0" in message


@fuzz(60)
@given(row=row_index, value=bad_reward)
def test_rewards_outside_zero_one_are_named(pool_file, row, value):
    rows = base_rows()
    rows[row]["reward"] = value
    table = pa.Table.from_pylist(rows, schema=POOL_SCHEMA)
    assert_rejected(
        write_pool(pool_file, table, good_metadata()), rf"row {row}, column 'reward': is .*expected 0 or 1"
    )


@fuzz(40)
@given(
    row=row_index,
    column=st.sampled_from(["prompt_token_ids", "response_token_ids"]),
    how=st.sampled_from(["empty", "null id", "negative id"]),
)
def test_broken_token_lists_are_named(pool_file, row, column, how):
    rows = base_rows()
    if how == "empty":
        rows[row][column] = []
        if column == "response_token_ids":
            rows[row]["behavior_logprobs"] = []
    else:
        rows[row][column][0] = None if how == "null id" else -7
    table = pa.Table.from_pylist(rows, schema=POOL_SCHEMA)
    expected = "is empty" if how == "empty" else "token ids must be >= 0"
    assert_rejected(
        write_pool(pool_file, table, good_metadata()), rf"row {row}, column '{column}': .*{expected}"
    )


@fuzz(30)
@given(row=row_index, column=st.sampled_from([f.name for f in POOL_SCHEMA if not f.nullable]))
def test_nulls_in_required_columns_are_named(pool_file, row, column):
    rows = base_rows()
    rows[row][column] = None
    nullable = pa.schema([field.with_nullable(True) for field in POOL_SCHEMA])
    table = pa.Table.from_pylist(rows, schema=nullable)
    assert_rejected(write_pool(pool_file, table, good_metadata()), rf"row {row}, column '{column}': is null")


# --- group layout: contiguity and sizes ----------------------------------------------------------------

layout_change = st.one_of(
    st.tuples(st.just("swap"), row_index, row_index).filter(lambda c: c[1] // M != c[2] // M),
    st.tuples(st.just("drop"), row_index, st.just(0)),
    st.tuples(st.just("repeat"), row_index, st.just(0)),
    st.tuples(st.just("move group"), st.integers(0, GROUPS - 2), st.integers(1, M - 1)),
)


@fuzz(60)
@given(change=layout_change)
def test_broken_group_layout_is_named(pool_file, change):
    rows = base_rows()
    kind, a, b = change
    if kind == "swap":
        rows[a], rows[b] = rows[b], rows[a]
    elif kind == "drop":
        rows.pop(a)
    elif kind == "repeat":
        rows.insert(a, dict(rows[a]))
    else:  # one row of group a reappears after group a + 1: the group is no longer contiguous
        rows.insert((a + 2) * M - 1, rows.pop(a * M + b))
    table = pa.Table.from_pylist(rows, schema=POOL_SCHEMA)
    assert_rejected(
        write_pool(pool_file, table, good_metadata()), r"column '(group_id|sample_idx|prompt_id)'"
    )


@fuzz(20)
@given(m=st.integers(1, 50).filter(lambda m: m != M))
def test_group_size_other_than_the_declared_m_is_named(pool_file, m):
    table = pa.Table.from_pylist(base_rows(), schema=POOL_SCHEMA)
    metadata = json.dumps(synthetic_metadata(m)).encode()
    assert_rejected(write_pool(pool_file, table, metadata), r"column '(group_id|sample_idx)'")


# --- metadata: missing or malformed --------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
metadata_sections = ["sampling", "model", "tokenizer", "dataset", "engine", "reward", "prompt_template"]


def _broken_metadata(draw) -> bytes | None:
    kind = draw(st.sampled_from(["missing", "bytes", "json", "version", "m", "section", "deep"]))
    if kind == "missing":
        return None
    if kind == "bytes":  # not JSON, or not UTF-8
        return draw(st.binary(max_size=40))
    if kind == "deep":  # nested beyond Python's recursion limit
        depth = draw(st.integers(2_000, 20_000))
        return b"[" * depth + b"]" * depth
    meta = synthetic_metadata(M)
    if kind == "json":
        return json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode()
    if kind == "version":
        meta["schema_version"] = draw(json_values.filter(lambda v: not (type(v) is int and v == 1)))
    elif kind == "m":
        meta["sampling"]["m"] = draw(
            json_values.filter(lambda v: not (type(v) is int and v >= 1)) | st.integers(max_value=0)
        )
    else:
        meta[draw(st.sampled_from(metadata_sections))] = draw(
            json_values.filter(lambda v: not isinstance(v, dict))
        )
    return json.dumps(meta).encode()


@fuzz(120)
@given(metadata=st.composite(lambda draw: _broken_metadata(draw))())
def test_missing_or_malformed_metadata_is_named(pool_file, metadata):
    table = pa.Table.from_pylist(base_rows(), schema=POOL_SCHEMA)
    assert_rejected(write_pool(pool_file, table, metadata), "metadata")


# --- the file itself: truncated or with random bytes overwritten ---------------------------------------


@pytest.fixture(scope="module")
def pool_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("bytes") / "pool.parquet"
    table = pa.Table.from_pylist(synthetic_rows(8, M, seed=2), schema=POOL_SCHEMA)
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: good_metadata()}), path, row_group_size=M * 2)
    return path.read_bytes()


@fuzz(60)
@given(fraction=st.floats(0.0, 1.0, exclude_max=True))
def test_truncated_files_are_named(pool_file, pool_bytes, fraction):
    pool_file.write_bytes(pool_bytes[: int(len(pool_bytes) * fraction)])
    assert_rejected(pool_file, "not a readable Parquet file")


@fuzz(300)
@given(data=st.data())
def test_random_byte_corruption_never_escapes_as_a_traceback(pool_file, pool_bytes, data):
    corrupted = bytearray(pool_bytes)
    for _ in range(data.draw(st.integers(1, 8), label="bytes changed")):
        corrupted[data.draw(st.integers(0, len(corrupted) - 1))] = data.draw(st.integers(0, 255))
    pool_file.write_bytes(bytes(corrupted))
    try:
        validate_pool(pool_file)  # a byte inside a value can leave a valid pool: that is fine
    except UserError as error:
        assert "\n" not in str(error) and str(error).startswith(f"{pool_file}: "), str(error)


def test_every_flipped_byte_in_a_written_pools_pages_is_caught(tmp_path):
    """Our pools carry page checksums: a byte changed anywhere in a column chunk (page headers and data)
    either fails validation or changes nothing a reader sees (header statistics)."""
    path = write_synthetic_pool(tmp_path / "pool.parquet", groups=2, m=2)
    original, table = path.read_bytes(), pq.read_table(path)
    metadata = pq.ParquetFile(path).metadata
    chunks = [metadata.row_group(0).column(c) for c in range(metadata.num_columns)]
    positions = [
        position
        for chunk in chunks
        for start in [chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset]
        for position in range(start, start + chunk.total_compressed_size)
    ]
    corrupted, caught_by_checksum, unchanged = tmp_path / "corrupted.parquet", 0, 0
    for position in positions:
        data = bytearray(original)
        data[position] ^= 0xFF
        corrupted.write_bytes(bytes(data))
        try:
            validate_pool(corrupted)
        except UserError as error:
            caught_by_checksum += "fails its checksum" in str(error)
            continue
        assert pq.read_table(corrupted).equals(table), f"byte {position} changed the data unnoticed"
        unchanged += 1
    assert caught_by_checksum > len(positions) / 2 and unchanged < len(positions) / 4


# --- the CLI: `ggpo pool validate` and `ggpo train` stop with one line --------------------------------


def _representative(tmp: Path) -> list[tuple[str, Path, str]]:
    """(case, pool, expected message) for one break of each kind."""
    table = pa.Table.from_pylist(base_rows(), schema=POOL_SCHEMA)
    cases = []

    def add(name: str, pool: pa.Table, metadata: bytes | None, expected: str) -> None:
        cases.append((name, write_pool(tmp / f"{name}.parquet", pool, metadata), expected))

    add("dropped", table.drop_columns(["reward"]), good_metadata(), "column 'reward' is missing")
    rows = base_rows()
    rows[4]["behavior_logprobs"].append(-0.1)
    add(
        "ragged",
        pa.Table.from_pylist(rows, schema=POOL_SCHEMA),
        good_metadata(),
        "row 4, column 'behavior_logp",
    )
    rows = base_rows()
    rows[2]["behavior_logprobs"][0] = float("nan")
    add("nan", pa.Table.from_pylist(rows, schema=POOL_SCHEMA), good_metadata(), "holds nan")
    rows = base_rows()
    rows[2 * M : 3 * M] = [dict(row) for row in rows[:M]]
    repeated = pa.Table.from_pylist(rows, schema=POOL_SCHEMA)
    add("contiguity", repeated, good_metadata(), "group 0 appears again")
    add("metadata", table, b"\xff{not json", "is not valid JSON")
    corrupt = tmp / "truncated.parquet"
    corrupt.write_bytes(cases[0][1].read_bytes()[:200])
    cases.append(("truncated", corrupt, "not a readable Parquet file"))
    return cases


def _assert_one_line(returncode: int, stdout: str, stderr: str, expected: str) -> None:
    assert returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], stderr
    assert "Traceback" not in stdout + stderr


def test_pool_validate_command_stops_with_one_line(tmp_path):
    for _, pool, expected in _representative(tmp_path):
        result = ggpo_here("pool", "validate", str(pool))
        _assert_one_line(result.returncode, result.stdout, result.stderr, expected)


def test_inspect_shows_a_pool_whose_metadata_has_only_what_validation_requires(pool_file):
    table = pa.Table.from_pylist(base_rows(), schema=POOL_SCHEMA)
    write_pool(pool_file, table, good_metadata())  # no engine, dataset, reward or timing sections
    result = subprocess.run(
        [GGPO, "pool", "inspect", str(pool_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "synthetic" in result.stdout and "Traceback" not in result.stderr


def test_train_command_stops_at_validation_with_one_line(tmp_path):
    # In-process (one torch import for every case); the last case also runs as a real subprocess.
    cases = _representative(tmp_path)
    for name, pool, expected in cases:
        out = tmp_path / f"run-{name}"
        result = ggpo_here("train", "--pool", str(pool), "--out", str(out), "--no-tracking")
        _assert_one_line(result.returncode, result.stdout, result.stderr, expected)
        assert not out.exists()  # stopped before the run folder, the model or the π0 cache
    _, pool, expected = cases[-1]
    args = [GGPO, "train", "--pool", str(pool), "--out", str(tmp_path / "run"), "--no-tracking"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    _assert_one_line(result.returncode, result.stdout, result.stderr, expected)
