"""`ggpo generate-pool`'s settings and their range checks."""

from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.settings import above, at_least, check_relations, check_settings, setting
from ggpo_offline.generate.datasets import DatasetColumns
from ggpo_offline.generate.engines.base import Dtype, EngineName, SamplingSettings
from ggpo_offline.generate.prompts import Template
from ggpo_offline.jobs.config import LaunchConfig

DEFAULT_POOL = Path("pools/base.parquet")
# 500 prompts x 8 responses: the tiny preset uses 160 groups per seed, and `make demo` must fit in 12 min.
DEFAULT_ARITH_PROMPTS = 500


@dataclass(frozen=True)
class GenerateConfig:
    """Everything ``ggpo generate-pool`` needs; the defaults give the embedded default pool."""

    model: str | None = setting(None, "Local Hugging Face model folder [default: the embedded tiny model].")
    dataset: str = setting(
        "arith:train", "arith[:train|validation|test], a .jsonl/.json/.parquet file, or hf:NAME[:SPLIT]."
    )
    columns: DatasetColumns = setting(default_factory=DatasetColumns)
    num_prompts: int | None = setting(
        None,
        f"Number of prompts [default: arith {DEFAULT_ARITH_PROMPTS}, files all rows].",
        valid=at_least(1),
    )
    first_prompt: int = setting(
        0,
        "Start at the dataset's prompt at this position: a later pool continues where another stopped.",
        valid=at_least(0),
    )
    keep_groups: int | None = setting(
        None,
        "Stop once this many groups are kept (with --mixed-only, mixed ones: Algorithm 1's N x G); the pool "
        "holds exactly that many [default: every prompt's].",
        valid=at_least(1),
    )
    sampling: SamplingSettings = setting(default_factory=SamplingSettings)
    policy_version: int | None = setting(
        None,
        "The training update whose weights --model holds, stamped in the pool's footer as asynchronous "
        "trainers stamp their samples (a --sync-every run's rounds set it) [default: none: initial weights].",
        valid=at_least(0),
    )
    learner_temperature: float | None = setting(
        None,
        "The temperature the learner's log-probs divide the logits by [default: --temperature, as verl, "
        "OpenRLHF and TRL do]; another value makes the sampler's distribution one the learner does not "
        "compute (a trainer that leaves the rollout temperature out): a mismatch of dose |τ − this|.",
        valid=above(0),
    )
    engine: EngineName = setting("vllm", "Generation engine: vllm or hf.")
    dtype: Dtype = setting("auto", "Engine dtype: auto, float32, bfloat16, float16.")
    template: Template = setting(
        "auto", "Prompt format: auto, chat (the tokenizer's chat template, paper prompts) or plain."
    )
    mixed_only: bool = setting(
        False, "Keep only groups with 0 < sum(r) < m (the paper's offline pool); default keeps all groups."
    )
    out: Path = setting(DEFAULT_POOL, "Output pool file.")
    overwrite: bool = setting(False, "Replace an existing pool file.")
    reward_workers: int = setting(2, "Worker processes for math-verify (0 = in-process).", valid=at_least(0))
    reward_timeout_s: float = setting(
        5.0,
        "Time limit of one response's scoring in seconds; past it the response scores 0.",
        valid=above(0),
    )
    batch_prompts: int = setting(
        256, "Prompts per engine call; each batch is saved for resuming.", valid=at_least(1)
    )
    shard_index: int = setting(
        0, "Generate shard i: prompts at positions i, i + n, i + 2n, ...", valid=at_least(0)
    )
    num_shards: int = setting(
        1, "Number of shards n (one job each; see `ggpo pool merge`).", valid=at_least(1)
    )
    tensor_parallel_size: int = setting(1, "vLLM tensor parallelism (GPUs per engine).", valid=at_least(1))
    data_parallel_size: int = setting(1, "vLLM data parallelism (engine replicas).", valid=at_least(1))
    launch: LaunchConfig = setting(default_factory=LaunchConfig)
    """Where the shards are generated: ``--launcher slurm`` submits the --num-shards shards as one job array,
    then merges them into --out (its fields are this config's settings)."""

    def __post_init__(self) -> None:
        check_settings(self)
        check_relations(_relations(self))


def _relations(config: GenerateConfig) -> list[tuple[bool, str]]:
    """What must hold between the settings, each in range (`check_settings`)."""
    return [
        (
            config.keep_groups is None or config.num_shards == 1,
            "--keep-groups stops one run at its count: give it without --num-shards",
        ),
        (
            config.shard_index < config.num_shards,
            f"--shard-index must be in 0..{config.num_shards - 1}, got {config.shard_index}",
        ),
        (
            config.launch.launcher != "slurm" or config.shard_index == 0,
            "--shard-index is each task's own with --launcher slurm: give --num-shards alone",
        ),
        (
            config.engine != "hf" or (config.tensor_parallel_size, config.data_parallel_size) == (1, 1),
            "--tensor-parallel-size and --data-parallel-size need --engine vllm (the hf engine runs on "
            "one device); use --shard-index/--num-shards to spread hf generation over jobs",
        ),
    ]
