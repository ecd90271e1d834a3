"""What a model generates, set against the pool it learns from: length, stop rate, the sampled tokens' NLL
and the share of its first tokens and token bigrams the pool's responses never show."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggpo_offline.generate.engines import Sample

DIAGNOSTICS = ("mean_length", "stop_rate", "nll", "novel_first_token", "novel_bigram")
"""The names of `GeneratedText.to_dict`, in order."""
BIGRAM_SHIFT = 32
"""A bigram (a, b) is the key a << 32 | b: token ids are int32, so keys are distinct int64."""


@dataclass(frozen=True)
class PoolSupport:
    """The first response tokens and the within-response token bigrams of a pool, sorted and unique."""

    first_tokens: np.ndarray
    bigrams: np.ndarray

    @classmethod
    def of_responses(cls, responses: list[list[int]]) -> "PoolSupport":
        first, bigrams = _first_tokens_and_bigrams(responses)
        return cls(np.unique(first), np.unique(bigrams))

    @classmethod
    def of_pool(cls, pool: Path) -> "PoolSupport":
        """Read from the pool's ``response_token_ids`` (a file or a shard directory), one column only."""
        import pyarrow as pa

        from ggpo_offline.pool.schema import open_parquet
        from ggpo_offline.pool.source import open_pool

        column = "response_token_ids"
        tables = [open_parquet(f).read(columns=[column]) for f in open_pool(pool).files]
        ids = pa.concat_tables(tables).column(column).combine_chunks()
        offsets = ids.offsets.to_numpy().astype(np.int64)
        values = ids.values.to_numpy().astype(np.int64)
        first, bigrams = _from_flat(values, offsets)
        return cls(np.unique(first), np.unique(bigrams))


def _first_tokens_and_bigrams(responses: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(r) for r in responses], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.fromiter((t for r in responses for t in r), dtype=np.int64, count=int(offsets[-1]))
    return _from_flat(values, offsets)


def _from_flat(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each non-empty response's first token, and every pair of consecutive tokens inside one response,
    from the flat token ids and the ``offsets`` of each response's start (Arrow's list layout)."""
    starts, ends = offsets[:-1], offsets[1:]
    first = values[starts[ends > starts]]
    keys = (values[:-1] << BIGRAM_SHIFT) | values[1:]
    inside = np.ones(len(keys), dtype=bool)
    # a pair whose second token opens a response straddles two responses
    opening = starts[(starts > 0) & (ends > starts)]
    inside[opening - 1] = False
    return first, keys[inside]


@dataclass
class GeneratedText:
    """Running totals over an evaluation's samples; ``to_dict`` gives the diagnostics (issue 39):

    - ``mean_length``: generated tokens per response (EOS included, as the pool counts them);
    - ``stop_rate``: the share of responses that ended with EOS rather than at the length limit;
    - ``nll``: the token mean of −log p of the sampled tokens under the sampling distribution, the Monte
      Carlo estimate of the generated text's per-token entropy;
    - ``novel_first_token``: the share of responses whose first token opens no response of the pool (for
      the embedded model, a style the pool never shows);
    - ``novel_bigram``: the share of generated token bigrams that occur in no response of the pool.

    The novelty shares need the pool's support (None without a pool)."""

    support: PoolSupport | None = None
    responses: int = 0
    tokens: int = 0
    stopped: int = 0
    nll_sum: float = 0.0
    novel_first: int = 0
    bigrams: int = 0
    novel_bigrams: int = 0

    def add(self, samples: list[Sample]) -> None:
        self.responses += len(samples)
        self.tokens += sum(len(s.token_ids) for s in samples)
        self.stopped += sum(s.finish_reason == "stop" for s in samples)
        self.nll_sum -= float(np.sum([lp for s in samples for lp in s.logprobs], dtype=np.float64))
        if self.support is not None:
            first, bigrams = _first_tokens_and_bigrams([s.token_ids for s in samples])
            self.novel_first += int((~np.isin(first, self.support.first_tokens)).sum())
            self.bigrams += len(bigrams)
            self.novel_bigrams += int((~np.isin(bigrams, self.support.bigrams)).sum())

    def to_dict(self) -> dict[str, float | None]:
        novel = self.support is not None
        values = (
            self.tokens / self.responses,
            self.stopped / self.responses,
            self.nll_sum / self.tokens if self.tokens else 0.0,
            self.novel_first / self.responses if novel else None,
            (self.novel_bigrams / self.bigrams if self.bigrams else 0.0) if novel else None,
        )
        return dict(zip(DIAGNOSTICS, values, strict=True))
