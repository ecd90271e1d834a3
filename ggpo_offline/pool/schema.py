"""The pool's Arrow schema, the metadata key it carries, and how our Parquet files are written and opened."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from ggpo_offline.core.errors import UserError, one_line
from ggpo_offline.pool.info import SECTIONS

SCHEMA_VERSION = 1
METADATA_KEY = b"ggpo_offline"

PARQUET_OPTIONS = {"compression": "zstd", "write_page_checksum": True, "store_schema": False}
"""Every Parquet file we write (pools, parts, π0 caches). Page checksums (CRC-32) let `open_parquet` catch a
byte flipped inside a value, which the format alone would decode silently. No copy of the Arrow schema in the
footer: the schema round-trips exactly without it (tested), and the footer's key-value metadata then *is*
the schema metadata Arrow readers show (``pq.read_schema(pool).metadata``, ``read_table(pool).schema``)."""

POOL_SCHEMA = pa.schema(
    [
        pa.field("group_id", pa.int64(), nullable=False),
        pa.field("sample_idx", pa.int16(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("response", pa.string(), nullable=False),
        pa.field("response_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("extracted_answer", pa.string(), nullable=True),
    ]
)


def open_parquet(path) -> pq.ParquetFile:
    """A Parquet file whose pages are checked against their checksums as they are read (an OSError names a
    mismatch); files written without checksums read as before."""
    return pq.ParquetFile(path, page_checksum_verification=True)


def read_file_metadata(path) -> dict:
    """The JSON metadata stored in a pool file's footer; UserError when it is missing or malformed."""
    try:
        kv = pq.ParquetFile(path).metadata.metadata or {}
    except (OSError, ValueError, pa.ArrowException) as exc:
        # ValueError covers pyarrow's ArrowInvalid and the UnicodeDecodeError of a corrupted column name.
        raise UserError(f"{path}: not a readable Parquet file ({one_line(exc)})") from None
    if METADATA_KEY not in kv:
        raise UserError(f"{path}: no '{METADATA_KEY.decode()}' metadata (not a ggpo-offline pool)")
    try:
        meta = json.loads(kv[METADATA_KEY])
    except (ValueError, RecursionError) as exc:
        # ValueError: bad JSON or bytes that are not UTF-8; RecursionError: JSON nested thousands deep.
        what = "nested too deeply" if isinstance(exc, RecursionError) else one_line(exc)
        raise UserError(f"{path}: metadata '{METADATA_KEY.decode()}' is not valid JSON ({what})") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path}: metadata '{METADATA_KEY.decode()}' is not a JSON object")
    # The footer record's sections (pool/info.py) must be JSON objects where present, so that a hand-edited or
    # corrupted footer is reported here rather than read as a section without values.
    for section in SECTIONS:
        if section in meta and not isinstance(meta[section], dict):
            raise UserError(
                f"{path}: metadata {section} is {_json_type(meta[section])}, expected a JSON object"
            )
    return meta


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
