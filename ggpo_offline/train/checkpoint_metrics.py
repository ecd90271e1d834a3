"""The names of what a run logs at each evaluated checkpoint beside its scores: its drift from π0 on the
fixed probe and what it generated. Torch-free, so that reports read them without loading the trainer."""

from ggpo_offline.evaluate import generated

PROBE_K3 = "probe/k3"
PROBE_LOG_RATIO = "probe/log_ratio"
PROBE_METRICS = (PROBE_K3, PROBE_LOG_RATIO)
"""With λ_t = log π_θ(a_t) − log π0(a_t) on the probe's responses (`ggpo_offline.train.probe`): the token
mean of exp(λ_t) − λ_t − 1 (SPEC "Diagnostics" `mismatch/k3` with π0 in μ's place) and the mean over
responses of Σ_t λ_t (SPEC `ref/log_ratio` with π0 as the reference)."""

GENERATED_PREFIX = "eval/generated/"
GENERATED_METRICS = tuple(f"{GENERATED_PREFIX}{name}" for name in generated.DIAGNOSTICS)
"""What each evaluation's samples looked like (`ggpo_offline.evaluate.generated`), logged with its scores."""

CHECKPOINT_METRICS = PROBE_METRICS + GENERATED_METRICS
