"""What the trainer must know of how a pool was sampled: the temperature of its log-probs, and whether they
can be matched at all."""

from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.info import PoolSampling


def _setting(pool: Path, sampling: PoolSampling, key: str, default: float) -> float:
    value = getattr(sampling, key)
    value = default if value is None else value  # older pools: the setting's default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{pool}: metadata sampling.{key} is {value!r}, expected a number")
    return value


def pool_temperature(pool: Path, sampling: PoolSampling) -> float:
    """The sampling temperature of the pool's behavior log-probs (1.0 when the metadata has none).

    Engines store log-probs of the processed distribution, softmax(logits / T), so every log-prob the
    trainer compares with them (learner, reference, old policy, π0) divides its logits by the same T, as
    the major RL libraries do.
    """
    temperature = _setting(pool, sampling, "temperature", 1.0)
    if not temperature > 0:
        raise UserError(f"{pool}: metadata sampling.temperature is {temperature!r}, expected > 0")
    return float(temperature)


def check_sampling(pool: Path, sampling: PoolSampling, allow_truncated: bool) -> float:
    """The pool's temperature, after refusing a pool sampled from a truncated distribution (top-p < 1 or
    top-k > 0) unless ``allow_truncated``."""
    top_p, top_k = _setting(pool, sampling, "top_p", 1.0), _setting(pool, sampling, "top_k", 0)
    truncation = ", ".join(
        ([f"top-p {top_p}"] if top_p < 1 else []) + ([f"top-k {top_k}"] if top_k > 0 else [])
    )
    if truncation and not allow_truncated:
        raise UserError(
            f"{pool} was sampled with {truncation}: its behavior log-probs are of the truncated "
            "distribution, which the learner's full-vocabulary log-probs cannot match (ratios, TIS weights "
            "and mismatch would be biased); pass --allow-truncated-sampling to train anyway"
        )
    return pool_temperature(pool, sampling)
