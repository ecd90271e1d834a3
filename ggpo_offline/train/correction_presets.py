"""The frameworks' rollout corrections as named presets, each a `Correction` of shared parts (no torch here).

Every preset follows its framework's code at the commit SPEC-corrections.md cites, with the framework's own
defaults; where the code and its docs or paper disagree, a second preset named ``…-docs`` or ``…-paper``
follows them. `ggpo_offline.train.learners` registers every preset as a learner.
"""

import struct
from dataclasses import dataclass, replace

COMMITS = {
    "verl": "b178a3c", "TRL": "f2cd577", "OpenRLHF": "3c3be62", "prime-rl": "559b447", "ROLL": "8eb27cc",
    "AReaL": "4aef98d",
}  # fmt: skip
"""The commit of each framework whose code the presets equal (SPEC-corrections.md's)."""

OBJECTIVES = ("ppo", "gspo", "reinforce", "cispo", "topr", "sapo", "dppo", "kimi")
RATIO_LEVELS = ("token", "sequence", "geometric")
"""How a weight is taken from token log-ratios: e^{x_t}; the product e^{Σ_t M x_t}; the geometric mean
e^{Σ_t M x_t / L_i}."""
REJECTION_LEVELS = ("token", "seq_sum", "seq_mean", "seq_max")
"""Where verl's rejection statistic is read (SPEC-corrections §a RS): per token, or per response as the sum,
the mean or the maximum of its tokens' statistics."""
REJECTION_STATISTICS = ("k1", "k2", "k3")
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
SEQUENCE_MEANS = ("verl", "trl")
"""How the frameworks' sequence means divide (their code, SPEC-corrections §f): verl's, OpenRLHF's and ROLL's
``agg_loss`` average the G responses with a token, each over L_i + 1e-8 tokens (ROLL's G is an integer
count, so its own + 1e-8 is lost in float32); TRL's ``grpo``/``sapo`` average all B responses, each over
max(L_i, 1) tokens."""


@dataclass(frozen=True)
class Correction:
    """The parts of one configuration (SPEC-corrections.md; field defaults are verl's PPO actor's)."""

    objective: str = "ppo"
    """`OBJECTIVES`: PPO clip (and dual clip), GSPO's sequence ratio under PPO, REINFORCE −A·w·log π_θ, CISPO,
    TOPR, SAPO, prime-rl's DPPO mask, Kimi-1.5's squared log-ratio."""
    bypass: bool = False
    """True: π_old := μ, so the objective's ratio is π_θ/μ and the behaviour statistics are taken from
    κ = log π_θ − log μ (detached, every call); False (decoupled): ratio π_θ/π_old, statistics from
    λ = log π_old − log μ."""
    weight: str | None = None
    """The importance weight's level (token, sequence product, geometric mean), or None for no weight."""
    weight_low: float | None = None
    weight_high: float | None = None
    truncate: bool = True
    """Outside [weight_low, weight_high] a weight is clamped (True) or set to 0 (False: TRL ``*_mask``,
    OpenRLHF ``icepop``, AReaL's mask action)."""
    batch_normalize: bool = False
    """verl's ``rollout_is_batch_normalize``: the truncated token or sequence weight divided by its mean over
    the minibatch (decoupled mode, where verl computes the weights once per batch)."""
    filter_level: str | None = None
    """A second level whose ratio must lie inside the bounds, the weight itself left unclamped (OpenRLHF
    ``seq-mask-tis``: the geometric mean filters the token weights)."""
    rejections: tuple[tuple[str, float | tuple[float, float]], ...] = ()
    """verl ``rollout_rs`` options with their thresholds, ANDed."""
    second_moment: float | None = None
    """AReaL M2PO's τ on λ² (over each call's tokens, as AReaL does per micro-batch)."""
    off_policy_delta: float | None = None
    """TRL's off-policy sequence mask δ."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    coefficient_low: float | None = None
    """CISPO's bounds on the detached ratio (None: open)."""
    coefficient_high: float | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    gap_low: float = 0.2
    gap_high: float = 0.2
    gap_both_sides: bool = False
    """prime-rl's ``ipo`` mask: |Δp| bounded whatever the advantage's sign (``default``: one side by sign)."""
    adv_tau: float = 1.0
    kl_tau: float = 1e-3
    """prime-rl's coefficient of κ², and Kimi-1.5's τ."""
    aggregation: str = "token-mean"
    scale: float | None = None
    sequence_mean: str = "verl"
    """Whose sequence mean a seq-mean aggregation takes (`SEQUENCE_MEANS`)."""
    count_kept: bool = False
    """True: the rejections and the M2 mask take their tokens out of the loss mask before the aggregation
    counts it (verl's ``response_mask ← mask·keep``, AReaL's M2 ``loss_mask``), so N, L_i and G count the kept
    tokens and a minibatch that keeps none has loss 0/0 = NaN with a zero gradient, as verl's; False: a
    rejected token adds 0 to the loss and still counts, so a rejection does not scale the step."""
    float32_ratio: bool = False
    """The behaviour weight and its bounds read from a float32 log-ratio, as AReaL's ``rejection_sampling``
    computes them whatever the inputs' precision."""

    @property
    def rejects(self) -> bool:
        """Whether a rejection or the M2 mask can take tokens out of the loss mask (`count_kept`)."""
        return bool(self.rejections) or self.second_moment is not None

    def __post_init__(self):
        options = [option.rpartition("_") for option, _ in self.rejections]
        parts = [
            ("objective", self.objective, OBJECTIVES),
            ("weight", self.weight, (None, *RATIO_LEVELS)),
            ("filter_level", self.filter_level, (None, *RATIO_LEVELS)),
            ("aggregation", self.aggregation, AGGREGATIONS),
            ("sequence_mean", self.sequence_mean, SEQUENCE_MEANS),
            *(("rejection level", level, REJECTION_LEVELS) for level, _, _ in options),
            *(("rejection statistic", statistic, REJECTION_STATISTICS) for _, _, statistic in options),
        ]
        for name, value, allowed in parts:
            if value not in allowed:
                choices = ", ".join(str(choice) for choice in allowed)
                raise ValueError(f"{name} is one of {choices}, got {value!r}")
        if self.batch_normalize and (
            self.bypass or self.weight not in ("token", "sequence") or not self.truncate or self.filter_level
        ):
            raise ValueError(
                "batch_normalize is verl's: a truncated token or sequence weight in decoupled mode "
                "(in bypass mode verl normalises each micro-batch's own weights, which this toolkit does not)"
            )


@dataclass(frozen=True)
class CorrectionPreset:
    """One framework configuration: what a user of that framework sets, and its parts here."""

    name: str
    """The --method value."""
    framework: str
    knobs: str
    """The framework's settings it reproduces (their defaults where not written)."""
    section: str
    """SPEC-corrections.md's section."""
    correction: Correction
    note: str = ""
    """Where the framework's code and its docs differ, or what this toolkit does differently."""
    equals: str = ""
    """The framework's function whose update this preset computes (at `COMMITS`' commit)."""
    tuned_lr: float | None = None
    """Its learning rate chosen by ``make tune-corrections`` (docs/corrections/tuning), for the presets
    ``make corrections`` compares (`ggpo_offline.train.learners.TUNED_LR`)."""


def _k1(spec: str) -> tuple[float, float]:
    """verl's k1 threshold "lo_hi": bounds on μ/π_old."""
    low, high = spec.split("_")
    return float(low), float(high)


# actor clip_ratio 0.2, clip_ratio_c 3.0, loss_agg_mode token-mean over the mask its rejection leaves
_VERL = Correction(count_kept=True)
_VERL_PPO = replace(_VERL, dual_clip=3.0)
_TOKEN_TIS = {"weight": "token", "weight_high": 2.0}
_SEQ_TIS = {"weight": "sequence", "weight_high": 2.0}
_GEO_RS = {"rejections": (("seq_mean_k1", _k1("0.999_1.001")),)}
_K3_RS = {"rejections": (("seq_mean_k3", 0.01),)}
_REINFORCE = {"objective": "reinforce"}
_VERL_DECOUPLED = "`compute_rollout_correction_and_add_to_batch`, then `compute_policy_loss_vanilla`"
_VERL_BYPASS = "`compute_policy_loss_bypass_mode`"


def _verl(name: str, arguments: str, tuned_lr: float | None = None, **parts) -> CorrectionPreset:
    """A verl ``RolloutCorrectionConfig`` classmethod preset with its default arguments."""
    bypass = name.startswith("bypass")
    correction = replace(_VERL_PPO, bypass=bypass, **parts)
    knobs = f"RolloutCorrectionConfig.{name}({arguments})"
    equals = _VERL_BYPASS if bypass else _VERL_DECOUPLED
    name = f"verl-{name.replace('_', '-')}"
    return CorrectionPreset(name, "verl", knobs, "a", correction, equals=equals, tuned_lr=tuned_lr)


_SEQ_RS = {"rejections": (("seq_sum_k1", _k1("0.5_2.0")),)}
VERL = (
    _verl("decoupled_token_is", "2.0", 1e-4, **_TOKEN_TIS),
    _verl("decoupled_seq_is", "2.0", 3e-4, **_SEQ_TIS),
    _verl("decoupled_seq_is_rs", '2.0, "0.5_2.0"', **_SEQ_TIS, **_SEQ_RS),
    _verl("decoupled_geo_rs", '"0.999_1.001"', 1e-4, **_GEO_RS),
    _verl("decoupled_geo_rs_seq_tis", '2.0, "0.999_1.001"', **_SEQ_TIS, **_GEO_RS),
    _verl("decoupled_geo_rs_token_tis", '2.0, "0.999_1.001"', **_TOKEN_TIS, **_GEO_RS),
    _verl("decoupled_k3_rs", "0.01", **_K3_RS),
    _verl("decoupled_k3_rs_seq_tis", "2.0, 0.01", **_SEQ_TIS, **_K3_RS),
    _verl("decoupled_k3_rs_token_tis", "2.0, 0.01", **_TOKEN_TIS, **_K3_RS),
    _verl("bypass_ppo_clip", "", 3e-4),
    _verl("bypass_ppo_clip_geo_rs", '"0.999_1.001"', **_GEO_RS),
    _verl("bypass_ppo_clip_k3_rs", "0.01", **_K3_RS),
    _verl("bypass_pg_is", "2.0", 1e-4, **_REINFORCE, **_SEQ_TIS),
    _verl("bypass_pg_geo_rs", '"0.999_1.001"', **_REINFORCE, **_GEO_RS),
    _verl("bypass_pg_geo_rs_seq_tis", '2.0, "0.999_1.001"', **_REINFORCE, **_SEQ_TIS, **_GEO_RS),
    _verl("bypass_pg_geo_rs_token_tis", '2.0, "0.999_1.001"', **_REINFORCE, **_TOKEN_TIS, **_GEO_RS),
)
"""verl's 16 ``RolloutCorrectionConfig`` presets, on its PPO actor (dual clip c = 3, token-mean)."""


def _batch_normalized(preset: CorrectionPreset) -> CorrectionPreset:
    """``preset`` with verl's ``rollout_is_batch_normalize=True`` (off in every verl preset)."""
    return CorrectionPreset(
        f"{preset.name}-norm", "verl", f"{preset.knobs}, rollout_is_batch_normalize=True", "a",
        replace(preset.correction, batch_normalize=True),
        note="Not a verl preset: its knob on this one; the weights' mean over the minibatch is 1.",
        equals=preset.equals,
    )  # fmt: skip


VERL_NORMALIZED = tuple(_batch_normalized(preset) for preset in VERL[:2])
"""The decoupled token and sequence TIS presets with verl's batch normalisation."""

_TRL = Correction(weight="sequence", weight_high=3.0, truncate=False)  # sequence_mask, clip_max 3, dapo
# TRL picks SAPO's temperature with torch.where of two Python floats, which makes it float32.
_TRL_TAU_NEG = struct.unpack("f", struct.pack("f", 1.05))[0]
_TRL_KNOBS = "GRPOConfig(vllm_importance_sampling_mode={}, vllm_importance_sampling_clip_max=3.0{})"


def _trl(
    name: str, mode: str, extra: str = "", note: str = "", tuned_lr: float | None = None, **parts
) -> CorrectionPreset:
    equals = "`GRPOTrainer._compute_loss` on `_generate_and_score_completions`' IS ratio"
    knobs = _TRL_KNOBS.format(repr(mode), extra)
    return CorrectionPreset(f"trl-{name}", "TRL", knobs, "b", replace(_TRL, **parts), note, equals, tuned_lr)


TRL = (
    _trl("token-truncate", "token_truncate", weight="token", truncate=True,
         note="The config docstring calls token_truncate the default; the code's default is sequence_mask."),
    _trl("token-mask", "token_mask", weight="token"),
    _trl("sequence-truncate", "sequence_truncate", truncate=True,
         note="The sequence ratio is the product of token ratios, not their geometric mean."),
    _trl("sequence-mask", "sequence_mask", note="TRL's default; a mask keeps the ratio inside the bounds.",
         tuned_lr=1e-4),
    _trl("sequence-mask-opsm", "sequence_mask", ", off_policy_mask_threshold=0.05", off_policy_delta=0.05,
         note="DeepSeek-V3.2's off-policy sequence mask; TRL sets no δ: 0.05 is SPEC-corrections' example."),
    _trl("gspo", "sequence_mask", ", importance_sampling_level='sequence', loss_type='grpo'",
         objective="gspo", aggregation="seq-mean-token-mean", sequence_mean="trl"),
    _trl("sapo", "sequence_mask", ", loss_type='sapo'", objective="sapo", aggregation="seq-mean-token-mean",
         sequence_mean="trl", tau_neg=_TRL_TAU_NEG,
         note="τ_neg is 1.05 in float32 (1.0499999523), as TRL's torch.where of two floats makes it."),
    _trl("cispo", "sequence_mask", ", loss_type='cispo'", objective="cispo", coefficient_high=0.2,
         note="The code caps the weight at epsilon_high itself (default 0.2).", tuned_lr=1e-4),
    _trl("cispo-docs", "sequence_mask", ", loss_type='cispo', epsilon_high=5.0", objective="cispo",
         coefficient_high=5.0, note="epsilon_high = 5, as TRL's docs suggest for CISPO."),
)  # fmt: skip
"""TRL's GRPOTrainer: PPO without a dual clip, dapo's global token mean, the vLLM IS weight on every loss."""

_OPENRLHF = Correction(weight="token", weight_low=0.5, weight_high=5.0)  # token_level_loss: token-mean
_OPENRLHF_KNOBS = "--algo.advantage.is_correction_enable --algo.advantage.is_correction_type {}"
_OPENRLHF_EQUALS = "`PolicyLoss.forward`"
OPENRLHF = (
    CorrectionPreset("openrlhf-tis", "OpenRLHF", _OPENRLHF_KNOBS.format("tis"), "c", _OPENRLHF,
           equals=_OPENRLHF_EQUALS),
    CorrectionPreset("openrlhf-icepop", "OpenRLHF", _OPENRLHF_KNOBS.format("icepop"), "c",
           replace(_OPENRLHF, truncate=False), equals=_OPENRLHF_EQUALS, tuned_lr=1e-4),
    CorrectionPreset("openrlhf-seq-mask-tis", "OpenRLHF", _OPENRLHF_KNOBS.format("seq-mask-tis"), "c",
           replace(_OPENRLHF, filter_level="geometric"),
           note="The geometric mean only filters: the code comment says clamped, the token weight is not.",
           equals=_OPENRLHF_EQUALS),
    CorrectionPreset("openrlhf-gspo-is", "OpenRLHF",
           _OPENRLHF_KNOBS.format("tis") + " --actor.policy_loss_type gspo", "c",
           Correction(objective="gspo", bypass=True, aggregation="seq-mean-token-mean"),
           note="With IS, GSPO folds π_θ/μ into its ratio and the thresholds go unused.",
           equals=_OPENRLHF_EQUALS),
)  # fmt: skip

_ROLL = Correction(aggregation="seq-mean-token-mean")  # ROLL's loss_agg_mode default
_ROLL_EQUALS = "`ActorPGWorker.loss_func` (rlvr)"
_AREAL_BEHAVE = Correction(weight="token", weight_high=5.0, float32_ratio=True)
_AREAL_EQUALS = "`grpo_loss_fn` (decoupled), with `ppo_actor_loss_fn`"
OTHERS = (
    CorrectionPreset("prime-rl", "prime-rl", '[trainer.loss] type="default"', "d",
           Correction(objective="dppo", bypass=True),
           note="The ratio carries gradient; docs/algorithms.md shows a clamp min(π/μ, δ) the code has not.",
           equals="`default_loss_fn`", tuned_lr=1e-4),
    CorrectionPreset("prime-rl-ipo", "prime-rl", '[trainer.loss] type="ipo"', "d",
           Correction(objective="dppo", bypass=True, gap_low=0.1, gap_high=0.1, gap_both_sides=True),
           note="Masks |Δp| > ipo_threshold 0.1 whatever the advantage's sign; otherwise the default loss.",
           equals="`ipo_loss_fn`"),
    CorrectionPreset("verl-gspo", "verl", "actor.policy_loss.loss_mode=gspo", "e",
           replace(_VERL, objective="gspo", aggregation="seq-mean-token-mean"),
           note="verl's clip_ratio default 0.2; `gspo-paper` uses the paper's 3e-4 / 4e-4.",
           equals="`compute_policy_loss_gspo`", tuned_lr=1e-4),
    CorrectionPreset("gspo-paper", "verl", "loss_mode=gspo, clip_ratio_low=3e-4, clip_ratio_high=4e-4", "e",
           replace(_VERL, objective="gspo", eps_low=3e-4, eps_high=4e-4, aggregation="seq-mean-token-mean"),
           equals="`compute_policy_loss_gspo`"),
    CorrectionPreset("verl-sapo", "verl", "actor.policy_loss.loss_mode=sapo", "e",
           replace(_VERL, objective="sapo", aggregation="seq-mean-token-mean"),
           equals="`compute_policy_loss_sapo`", tuned_lr=1e-4),
    CorrectionPreset("verl-cispo", "verl", "actor.policy_loss.loss_mode=cispo", "e",
           replace(_VERL, objective="cispo", coefficient_low=0.8, coefficient_high=1.2),
           equals="`compute_policy_loss_cispo`"),
    CorrectionPreset("roll-cispo", "ROLL", "pg_variant=cispo", "e",
           replace(_ROLL, objective="cispo", coefficient_low=0.9, coefficient_high=1.1), equals=_ROLL_EQUALS),
    CorrectionPreset("roll-topr", "ROLL", "pg_variant=topr", "e", replace(_ROLL, objective="topr"),
           note="The ratio is token-level π_θ/π_old; the paper's is sequence-level π/μ.",
           equals=_ROLL_EQUALS, tuned_lr=1e-4),
    CorrectionPreset("roll-kimi15", "ROLL", "pg_variant=kimi15", "e",
                     replace(_ROLL, objective="kimi", kl_tau=0.1),
           note="kimi15_tau 0.1 is a getattr default, not a declared field.", equals=_ROLL_EQUALS),
    CorrectionPreset("areal-m2po", "AReaL", "actor.m2_threshold=0.04", "e",
           Correction(second_moment=0.04, count_kept=True),
           note="The paper defines M2 on π_θ/μ, the code on π_prox/μ. `areal-m2po-gsm8k` is AReaL's example.",
           equals=_AREAL_EQUALS, tuned_lr=1e-4),
    CorrectionPreset("areal-m2po-gsm8k", "AReaL",
           "examples/math/gsm8k_m2po.yaml: m2_threshold=0.04, eps_clip=0.0, rejection_sampling(upper=5.0)",
           "e", replace(_AREAL_BEHAVE, second_moment=0.04, count_kept=True, truncate=False, eps_low=0.0,
                        eps_high=0.0),
           note="The example takes one update a batch (ppo_n_minibatches 1): --tis-block 1 reproduces it.",
           equals=_AREAL_EQUALS),
    CorrectionPreset("areal-behave-mask", "AReaL",
                     "rejection_sampling(level=token, action=mask, upper=5.0)", "e",
           replace(_AREAL_BEHAVE, truncate=False), equals=_AREAL_EQUALS),
    CorrectionPreset("areal-behave-clamp", "AReaL",
                     "rejection_sampling(level=token, action=clamp, upper=5.0)", "e",
           _AREAL_BEHAVE, equals=_AREAL_EQUALS),
)  # fmt: skip

CORRECTION_PRESETS: tuple[CorrectionPreset, ...] = VERL + VERL_NORMALIZED + TRL + OPENRLHF + OTHERS

_OBJECTIVE_WORDS = {
    "ppo": "PPO", "gspo": "GSPO sequence ratio", "reinforce": "−A·w·log π_θ", "cispo": "CISPO",
    "topr": "TOPR", "sapo": "SAPO", "dppo": "DPPO Δp mask + κ²", "kimi": "−A log π_θ + τ/2·ρ²",
}  # fmt: skip


def _bounds(low: float | None, high: float | None) -> str:
    return f"[{'' if low is None else f'{low:g}'}, {'' if high is None else f'{high:g}'}]"


def describe(correction: Correction) -> str:
    """One line naming the parts: "PPO dual-clip on π_θ/π_old × sequence w truncated [, 2]; seq_mean_k1
    rejection; token-mean of the kept tokens"."""
    c = correction
    objective = _OBJECTIVE_WORDS[c.objective]
    if c.objective == "ppo" and c.dual_clip is not None:
        objective += " dual-clip"
    if c.objective == "cispo":
        objective += f" clip {_bounds(c.coefficient_low, c.coefficient_high)}"
    text = f"{objective} on {'π_θ/μ' if c.bypass else 'π_θ/π_old'}"
    if c.weight is not None:
        kept = (
            "filtered by the geometric mean in"
            if c.filter_level
            else ("truncated" if c.truncate else "masked")
        )
        precision = " (float32)" if c.float32_ratio else ""
        text += f" × {c.weight} w{precision} {kept} {_bounds(c.weight_low, c.weight_high)}"
        if c.batch_normalize:
            text += ", batch-normalised"
    masks = [option for option, _ in c.rejections]
    masks += ["M2"] * (c.second_moment is not None) + ["off-policy sequence"] * (
        c.off_policy_delta is not None
    )
    if masks:
        text += f"; {', '.join(masks)} rejection"
    aggregation = c.aggregation
    if c.aggregation.startswith("seq-mean") and c.sequence_mean != "verl":
        aggregation += " (TRL's)"
    if c.count_kept and c.rejects:
        aggregation += " of the kept tokens"
    return f"{text}; {aggregation}"
