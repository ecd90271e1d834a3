"""The pool footer (the JSON object under a pool's ``ggpo_offline`` metadata key) as one typed record.

generate-pool and import build a `PoolInfo`, `PoolWriter.close` stores its ``to_metadata()``, and every
reader (validation, planning, training, evaluation, ``pool inspect``, reports) parses the footer once with
``PoolInfo.from_metadata``.

Each section that code reads value by value is a typed sub-record. Its other keys stay in ``other``, as
stored: free-form provenance no code reads key by key (the dataset's resolved columns, the reward rule's
texts, the seed derivation) and keys a newer version writes. The run's flat settings (``config``) and an
import's provenance (``import``) are plain dicts for the same reason. A field is None where the footer has
no value (older pools lack some keys). Values are taken as stored: the code that relies on one checks it
and names the problem (`validate_pool`, `check_sampling`).

``from_metadata(meta).to_metadata()`` is ``meta`` again, unknown keys included (typed keys in the writers'
order, the others in the order read; the footer is stored with sorted keys), so a read → write round trip
(``ggpo pool merge``) keeps the footer bytes and the pool fingerprint. A section stored empty (``{}``), or
holding nulls only, reads as absent and is written back left out.
"""

from dataclasses import Field, dataclass, field, fields
from typing import Self

from ggpo_offline.core.model_io import EMBEDDED_MODEL


def _nullable():
    # A field a writer stores as null (JSON null differs from a left-out key): see `_Section.left_out`.
    return field(default=None, metadata={"nullable": True})


def _stored_as(key: str, **kwargs):
    # A field whose JSON key is not a Python name (``class``, ``import``).
    return field(metadata={"key": key}, **kwargs)


@dataclass(frozen=True, kw_only=True)
class _Section:
    """A JSON object of the footer: typed fields, None where it has no value, and the keys none holds."""

    other: dict = field(default_factory=dict)
    """The object's keys no field holds, as stored (see the module docstring)."""
    left_out: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    """Nullable fields the stored object lacks: written back left out rather than as null. Set by
    `from_dict` alone; a record a writer builds writes its nullable fields even when None."""

    @classmethod
    def from_dict(cls, value: object) -> Self:
        """The record of a stored JSON object (an absent or non-object value has no values)."""
        stored = value if isinstance(value, dict) else {}
        typed = _typed_fields(cls)
        keys = {_key(f) for f in typed}
        return cls(
            **{f.name: _read(f, stored.get(_key(f))) for f in typed},
            other={key: value for key, value in stored.items() if key not in keys},
            left_out=frozenset(f.name for f in typed if f.metadata.get("nullable") and _key(f) not in stored),
        )

    def to_dict(self) -> dict:
        """The JSON object: typed fields in declared order (None left out, except nullable ones not in
        `left_out`; an empty section left out), then ``other``; {} when nothing has a value."""
        stored = {}
        for f in _typed_fields(type(self)):
            value = getattr(self, f.name)
            if isinstance(value, _Section):
                value = value.to_dict() or None
            if value is not None or (f.metadata.get("nullable") and f.name not in self.left_out):
                stored[_key(f)] = value
        if all(value is None for value in stored.values()) and not self.other:
            return {}
        return stored | self.other


def _typed_fields(kind: type) -> list[Field]:
    return [f for f in fields(kind) if f.name not in ("other", "left_out")]


def _key(f: Field) -> str:
    return f.metadata.get("key", f.name)


def _read(f: Field, value: object):
    return f.type.from_dict(value) if _is_section(f) else value


def _is_section(f: Field) -> bool:
    return isinstance(f.type, type) and issubclass(f.type, _Section)


@dataclass(frozen=True, kw_only=True)
class PoolModel(_Section):
    """The model that sampled the pool (an import: the --model it was given as the sampler)."""

    path: str | None = None
    """Its folder on the machine that generated the pool."""
    name: str | None = None
    """``embedded:tiny`` for the shipped tiny model, else the --model given to generate-pool or import."""
    weights_sha256: str | None = None
    policy_version: int | None = None
    """The training update whose weights these are (a run's round: the version that sampled it); absent
    for an initial model."""
    group_versions: dict | None = None
    """Group id (a string) → the policy version that sampled it, for a pool of several samplers' groups (a
    --lag mixed round, `assemble_pool`); absent: every group is ``policy_version``'s."""

    @property
    def location(self) -> str | None:
        """Where `train` finds this model by default: its folder, or None for the embedded model, whose
        folder differs between installs."""
        return None if self.name == EMBEDDED_MODEL else self.path


@dataclass(frozen=True, kw_only=True)
class PoolTokenizer(_Section):
    """The tokenizer that encoded the prompts and responses."""

    sha256: str | None = None
    """Its `tokenizer_sha256`, which `train` compares with the model's."""
    class_name: str | None = _stored_as("class", default=None)


@dataclass(frozen=True, kw_only=True)
class PoolEngine(_Section):
    """The engine that sampled the responses."""

    name: str | None = None
    """``hf`` or ``vllm``; ``imported:<format>`` for an import."""
    version: str | None = _nullable()
    """The engine package's version (null for an import)."""


@dataclass(frozen=True, kw_only=True)
class PoolSampling(_Section):
    """How the responses were sampled (`SamplingSettings` plus what the engine reports)."""

    m: int | None = None
    """Responses per prompt (group size)."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = _nullable()
    """The global sampling seed (null for an import)."""
    logprobs_mode: str | None = None
    """What the behavior log-probs are of (e.g. ``processed_logprobs``; ``rescored`` for an import that
    re-scored them)."""
    learner_temperature: float | None = None
    """The temperature the learner's log-probs use when it is not ``temperature`` (generate-pool's
    --learner-temperature: a sampler the learner does not compute); absent: ``temperature``."""


@dataclass(frozen=True, kw_only=True)
class PoolDataset(_Section):
    """The dataset the prompts came from; ``other``: its source, content sha256, columns, split, limit."""

    spec: str | None = None
    """As given to generate-pool (``imported:<format>`` for an import)."""


@dataclass(frozen=True, kw_only=True)
class PoolTemplate(_Section):
    """The prompt template; ``other``: its texts (system prompt and user suffix, or the plain template)."""

    kind: str | None = None
    """``chat`` or ``plain``."""


@dataclass(frozen=True, kw_only=True)
class PoolReward(_Section):
    """How the rewards were computed; ``other``: the extraction and answer rules' descriptions."""

    answer_rule: str | None = None
    source: str | None = None
    """An import's: ``verify`` (scored here) or ``file`` (taken from the source)."""
    timeouts: int | None = None
    """Responses whose scoring ran out of time (scored 0)."""
    errors: int | None = None
    """Responses whose scoring failed (scored 0)."""


@dataclass(frozen=True, kw_only=True)
class PoolFilter(_Section):
    """Which sampled groups the pool keeps."""

    mixed_only: bool | None = None
    """Whether groups whose rewards are all equal were left out (--mixed-only)."""


@dataclass(frozen=True, kw_only=True)
class PoolCounts(_Section):
    """What the pool holds, as counted while it was written (an import records the last four only)."""

    prompts: int | None = None
    skipped_long_prompts: int | None = None
    groups: int | None = None
    responses: int | None = None
    mixed_groups: int | None = None
    mean_reward: float | None = None
    tokens: int | None = None
    truncated: int | None = None


@dataclass(frozen=True, kw_only=True)
class PoolShard(_Section):
    """A shard's place in its sharded run (no values: not a shard)."""

    index: int | None = None
    count: int | None = None
    dataset_prompts: int | None = None
    """Prompts in the whole dataset, which every shard of one run shares."""


@dataclass(frozen=True, kw_only=True)
class PoolInfo(_Section):
    """A pool's footer: how it was made. ``other`` holds top-level keys this version does not know."""

    schema_version: int | None = None
    tool_version: str | None = None
    created: str | None = None
    """ISO time the pool was written (a merged pool: its latest shard's)."""
    source: str | None = None
    """``imported`` for an imported pool."""
    model: PoolModel = field(default_factory=PoolModel)
    tokenizer: PoolTokenizer = field(default_factory=PoolTokenizer)
    engine: PoolEngine = field(default_factory=PoolEngine)
    dtype: str | None = None
    """The engine's weight dtype."""
    sampling: PoolSampling = field(default_factory=PoolSampling)
    dataset: PoolDataset = field(default_factory=PoolDataset)
    prompt_template: PoolTemplate = field(default_factory=PoolTemplate)
    reward: PoolReward = field(default_factory=PoolReward)
    filter: PoolFilter = field(default_factory=PoolFilter)
    counts: PoolCounts = field(default_factory=PoolCounts)
    config: dict | None = None
    """generate-pool's settings but the sampling ones, flat as the flags name them (free-form)."""
    generation_seconds: float | None = None
    shard: PoolShard = field(default_factory=PoolShard)
    imported: dict | None = _stored_as("import", default=None)
    """An import's provenance (free-form): its format, files, where log-probs and rewards came from, group
    sizes, what was dropped, the consistency check."""

    @classmethod
    def from_metadata(cls, meta: dict) -> "PoolInfo":
        """The record of a footer's JSON object."""
        return cls.from_dict(meta)

    def to_metadata(self) -> dict:
        """The footer's JSON object, as `PoolWriter.close` stores it."""
        return self.to_dict()

    @property
    def raw(self) -> dict:
        """The footer as one JSON object (`to_metadata`), for callers that record all of it (reports)."""
        return self.to_metadata()

    @property
    def tokenizer_sha256(self) -> str | None:
        return self.tokenizer.sha256

    @property
    def dataset_spec(self) -> str | None:
        return self.dataset.spec


SECTIONS = tuple(_key(f) for f in _typed_fields(PoolInfo) if _is_section(f))
"""The footer's keys that hold a typed section: each must be a JSON object where present."""
