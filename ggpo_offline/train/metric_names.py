"""The names a run logs its metrics under (metrics.jsonl, MLflow), per update and at evaluated checkpoints:
the trainer writes them and the reports read them, through these constants (SPEC.md "Diagnostics").
Torch-free, so that reports read them without loading the trainer."""

from ggpo_offline.evaluate import generated

UPDATE = "update"
"""The update a metrics.jsonl record belongs to (its MLflow step)."""
LOSS = "loss"
MISMATCH_K3 = "mismatch/k3"
MISMATCH_DRIFT = "mismatch/drift"
MISMATCH_ESS = "mismatch/ess"
"""The minibatch's normalized sequence ESS."""
MISMATCH_ESS_BLOCK = "mismatch/ess_block"
"""The sequence ESS over a block of --ess-block updates: logged at the block's last update only."""
POLICY_ENTROPY = "policy/entropy"
REF_LOG_RATIO = "ref/log_ratio"
"""Logged only by learners with a reference."""
GRAD_NORM = "optim/grad_norm"
REWARD = "train/reward"
RESPONSE_LENGTH = "train/response_length"
TRUNCATED_FRAC = "train/truncated_frac"
FILTERED_FRAC = "train/filtered_frac"
Q_ESS = "ggpo/q_ess"
SUCCESS_ESS = "ggpo/success_ess"

# What a run logs at each evaluated checkpoint beside its scores: its drift from π0 on the fixed probe and
# what it generated.
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

AGE, AGE_MIN, AGE_MAX = "policy/age", "policy/age_min", "policy/age_max"
"""Every update: the mean, least and greatest age of its minibatch's groups, a group's age the updates
trained since the policy that sampled it (prime-rl's lag: the step that consumes a rollout − the version
that sampled it): the update itself offline (π0 sampled the pool), 0 .. N − 1 within a synchronous round of
--sync-every N, K .. K + N − 1 with --off-policy-steps K, 1 .. K in every minibatch with --lag mixed (the
versions its round's pool records, so that a replay of the rounds logs the same)."""
AGE_METRICS = (AGE, AGE_MIN, AGE_MAX)


def k3_at_age(age: int | str) -> str:
    """`mismatch/k3` over the tokens of the minibatch's groups of one age: logged where a minibatch mixes
    ages (--lag mixed), the mismatch by age (``""``: the names' common prefix)."""
    return f"{MISMATCH_K3}@age{age}"


def share_at_age(age: int | str) -> str:
    """The share of the minibatch's groups of one age, logged beside `k3_at_age`: its age histogram."""
    return f"{AGE}_share@age{age}"


BY_AGE = (share_at_age, k3_at_age)
"""The by-age metrics of a minibatch that mixes ages, in the order the diagnostics show them."""


# What a --sync-every run logs at each round's first update: the round's pool under the policy that sampled
# it, before any update on it (Figure 7's diagnostics; λ_t = log π_θ(a_t) − log μ(a_t) with π_θ the
# sampling checkpoint, so λ is the training-inference mismatch alone; with --off-policy-steps K it is the
# policy that first trains on the round, K updates after its sampler). The per-update mismatch/* metrics
# then show the same as the round ages.
ROUND_INDEX = "round/index"
ROUND_K3 = "round/k3"
"""Token mean of exp(λ_t) − λ_t − 1 over the round."""
ROUND_ESS = "round/ess"
"""Normalized sequence ESS of exp(Σ_t λ_t) over the round's responses."""
ROUND_RATIO_QUANTILES = (("round/ratio_p05", 0.05), ("round/ratio_p50", 0.5), ("round/ratio_p95", 0.95))
"""(name, quantile) of the token ratio exp(λ_t) over the round's tokens."""
ROUND_ENTROPY = "round/entropy"
ROUND_LENGTH = "round/response_length"
ROUND_METRICS = (
    ROUND_K3,
    ROUND_ESS,
    *(name for name, _ in ROUND_RATIO_QUANTILES),
    ROUND_ENTROPY,
    ROUND_LENGTH,
)
"""Every measure of a round, in its logged order (after ROUND_INDEX)."""

# What every run logs at its first update: its pool's sampler against the learner before any update, over the
# pool's every mixed group (`ggpo_offline.train.sampler_mismatch`): the mismatch a dose made (a bf16 engine, a
# temperature the learner does not apply, a truncated sampler), in the field's measures.
SAMPLER_FIELDS = (
    "abs_log_ratio", "k3", "probs_diff", "mult_prob_error", "ess", "ratio_p05", "ratio_p50", "ratio_p95",
    "outside",
)  # fmt: skip
"""`SamplerMismatch`'s measures in its field order: mean |λ_t|, K3, mean |π − μ|, mean exp|λ_t|, sequence
ESS, token-ratio quantiles, the share of token ratios outside [0.5, 2]."""
SAMPLER_METRICS = tuple(f"sampler/{name}" for name in SAMPLER_FIELDS)
