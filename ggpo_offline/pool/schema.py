"""The pool's Arrow schema and the metadata key it carries."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from ggpo_offline.errors import UserError

SCHEMA_VERSION = 1
METADATA_KEY = b"ggpo_offline"

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


def read_pool_metadata(path) -> dict:
    """The JSON metadata stored in a pool file's footer; UserError when it is missing or malformed."""
    try:
        kv = pq.ParquetFile(path).metadata.metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
    if METADATA_KEY not in kv:
        raise UserError(f"{path}: no '{METADATA_KEY.decode()}' metadata (not a ggpo-offline pool)")
    try:
        meta = json.loads(kv[METADATA_KEY])
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: metadata '{METADATA_KEY.decode()}' is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path}: metadata '{METADATA_KEY.decode()}' is not a JSON object")
    return meta
