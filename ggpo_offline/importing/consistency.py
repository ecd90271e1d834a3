"""Do the stored behaviour log-probs come from --model at the stated sampling settings? A sample of the
responses re-scored under it, and a plain warning naming the likeliest cause when they do not."""

import math

import torch

from ggpo_offline.importing.rescore import Scorer
from ggpo_offline.train.diagnostics import sequence_ess

TOKEN_GAP_LIMIT = 0.05
"""Token-mean |log π0 − log μ| (nats) above which the stored log-probs are not --model's whatever the
temperature: another model, or a truncated sampler. The same model in another engine differs by far less
(the embedded model sampled by vLLM in float32: ~1e-7 here; bf16 engines: ~1e-2)."""
BETTER_FIT = 4.0
"""Another temperature fitting this many times better than the stated one names it: a confident model moves
little with the temperature (0.7 instead of 1 shifts the embedded model's log-probs by ~0.01 nats per
token), so the gap alone cannot tell."""
AGREEMENT = 1e-4
"""Below this token-mean gap the stored log-probs are --model's at the stated temperature (float32 engines
agree to ~1e-7) and no other temperature is tried."""
DIFFERING = 0.01
"""Nats by which a token's stored and rescored log-probs must differ to count in the sign test: above a
bf16 engine's noise on most tokens."""
TRUNCATED_SHARE = 0.95
"""A truncated sampler renormalizes the kept tokens, so its log-probs exceed the model's at *every* token
(measured on the rehearsal model: top-p 0.8, 0.95 and top-k 5 each 100 % of the differing tokens, 99 % with
bf16-sized noise added); another model's are higher on average but not everywhere (another seed of the
rehearsal model 69 %, noisy weights of the embedded model 72-81 %; noise alone 49 %)."""
MIN_DIFFERING = 10
"""Fewest differing tokens the sign test decides on (10 of 10 higher by chance: 0.1 %)."""
TEMPERATURES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5)
"""Temperatures tried beside the stated one, to name the one the log-probs are of."""


def check_logprobs(
    rows: list[dict], scorer: Scorer, temperature: float, truncation_stated: bool, mode: str
) -> dict:
    """Re-score ``rows`` (pool rows with stored ``behavior_logprobs``) under the model at the stated and at
    other temperatures: the token-mean |log π0 − log μ|, the mean of log μ − log π0 and the sequence ESS of
    the weights π0/μ at the stated one, the best-fitting temperature, the share of differing tokens whose
    stored log-prob is the higher (a truncated sampler's sign), and a ``warning`` (None when the stated
    settings fit)."""
    stated = _gaps(rows, scorer.logprobs(rows, temperature))
    fits = {temperature: _compare(stated)}
    if fits[temperature][0] > AGREEMENT:
        fits |= {t: _compare(_gaps(rows, scorer.logprobs(rows, t))) for t in TEMPERATURES if t != temperature}
    gap, signed, ess = fits[temperature]
    differing, higher = _signs(stated)
    best = min(fits, key=lambda t: fits[t][0])
    report = {
        "responses": len(rows),
        "tokens": sum(len(row["response_token_ids"]) for row in rows),
        "temperature": temperature,
        "token_mean_abs_gap": gap,
        "mean_stored_minus_model": signed,
        "sequence_ess": ess,
        "differing_tokens": differing,
        "differing_stored_higher": higher,
        "best_temperature": best,
        "best_temperature_gap": fits[best][0],
        "warning": None,
    }
    said = (
        f"the stored log-probs differ from --model's at temperature {temperature} by {gap:.2g} nats per "
        f"token (sequence ESS {ess:.2f} over {len(rows)} responses)"
    )
    truncated = differing >= MIN_DIFFERING and higher >= TRUNCATED_SHARE
    if best != temperature and fits[best][0] * BETTER_FIT <= gap:
        cause = f"they are --model's at temperature {best} ({fits[best][0]:.2g} nats per token)"
        if best == 1.0 and mode != "raw_logprobs":
            cause += (
                ": vLLM's default --logprobs-mode raw_logprobs gives log-probs before temperature; sample "
                "with processed_logprobs, or pass --rescore-behavior"
            )
        else:
            cause += f": pass --temperature {best} if that is what they were sampled at"
    elif truncated and not truncation_stated:
        cause = (
            f"they are higher than --model's at {higher:.0%} of the {differing} tokens that differ: a "
            "truncated sampler (top-p or top-k) renormalized them; pass the --top-p/--top-k they were "
            "sampled with"
        )
    elif truncated or gap <= TOKEN_GAP_LIMIT:
        return report
    else:
        cause = "no temperature fits: another model (or other weights) sampled these rollouts"
    report["warning"] = f"{said}; {cause}"
    return report


def _compare(gaps: list[list[float]]) -> tuple[float, float, float]:
    """(token-mean |Δ|, token-mean of stored − rescored, sequence ESS) of per-token Δ = rescored − stored."""
    tokens = sum(len(g) for g in gaps)
    gap = sum(abs(d) for g in gaps for d in g) / tokens
    signed = -sum(d for g in gaps for d in g) / tokens
    ess = float(sequence_ess(torch.tensor([math.fsum(g) for g in gaps], dtype=torch.float64)))
    return gap, signed, ess


def _signs(gaps: list[list[float]]) -> tuple[int, float]:
    """How many tokens differ by more than DIFFERING, and the share of them whose stored value is higher."""
    differing = [d for g in gaps for d in g if abs(d) > DIFFERING]
    return len(differing), sum(d < 0 for d in differing) / max(len(differing), 1)


def _gaps(rows: list[dict], rescored: list[list[float]]) -> list[list[float]]:
    """rescored − stored per token of each response."""
    return [
        [model - stored for model, stored in zip(values, row["behavior_logprobs"], strict=True)]
        for values, row in zip(rescored, rows, strict=True)
    ]
