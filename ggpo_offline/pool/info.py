"""A pool's description (its ``ggpo_offline`` footer metadata) as typed fields, parsed once.

Every field is None where the metadata has no value (older pools lack some keys). Values are taken as
stored: the code that relies on one checks it and names the problem (`validate_pool`, `check_sampling`).
"""

from dataclasses import dataclass, fields
from pathlib import Path

from ggpo_offline.core.model_io import EMBEDDED_MODEL
from ggpo_offline.pool.source import read_pool_metadata


@dataclass(frozen=True)
class PoolModel:
    """The model that sampled the pool."""

    name: str | None = None
    """``embedded:tiny`` for the shipped tiny model, else the --model given to generate-pool."""
    path: str | None = None
    """Its folder on the machine that generated the pool."""
    weights_sha256: str | None = None

    @property
    def location(self) -> str | None:
        """Where `train` finds this model by default: its folder, or None for the embedded model, whose
        folder differs between installs."""
        return None if self.name == EMBEDDED_MODEL else self.path


@dataclass(frozen=True)
class PoolSampling:
    """How the responses were sampled (`SamplingSettings` plus what the engine reports)."""

    m: int | None = None
    """Responses per prompt (group size)."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    logprobs_mode: str | None = None
    """What the engine's behavior log-probs are of (e.g. ``processed_logprobs``)."""


@dataclass(frozen=True)
class PoolInfo:
    """What a pool's metadata says about how it was made."""

    schema_version: int | None
    model: PoolModel
    tokenizer_sha256: str | None
    dtype: str | None
    """The engine's weight dtype."""
    sampling: PoolSampling
    template_kind: str | None
    """The prompt template: ``chat`` or ``plain``."""
    dataset_spec: str | None
    """The dataset the prompts came from, as given to generate-pool."""
    raw: dict
    """The metadata as stored, for callers that record all of it (MLflow params, reports)."""

    @classmethod
    def from_metadata(cls, meta: dict) -> "PoolInfo":
        return cls(
            schema_version=meta.get("schema_version"),
            model=_parse(PoolModel, meta.get("model")),
            tokenizer_sha256=_section(meta.get("tokenizer")).get("sha256"),
            dtype=meta.get("dtype"),
            sampling=_parse(PoolSampling, meta.get("sampling")),
            template_kind=_section(meta.get("prompt_template")).get("kind"),
            dataset_spec=_section(meta.get("dataset")).get("spec"),
            raw=meta,
        )


def read_pool_info(path: Path | str) -> PoolInfo:
    """The description of a pool file, or of a shard directory (its shards' metadata merged)."""
    return PoolInfo.from_metadata(read_pool_metadata(path))


def _section(value: object) -> dict:
    # A section that is absent (or not a JSON object) has no values.
    return value if isinstance(value, dict) else {}


def _parse(kind: type, value: object):
    section = _section(value)
    return kind(**{f.name: section.get(f.name) for f in fields(kind)})
