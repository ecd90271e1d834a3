"""The settings of the organism's commands: `ggpo build-tiny-model`, `ggpo build-rehearsal-model` and
`ggpo measure-styles`."""

from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.settings import at_least, check_settings, setting
from ggpo_offline.generate.arith import Split


@dataclass(frozen=True)
class TinyModelConfig:
    """What ``ggpo build-tiny-model`` builds and where (the recipe in `tiny.py`)."""

    out: Path = setting(help="Folder to write the model into.")
    seed: int = setting(0, "Training seed.", valid=at_least(0))
    steps: int = setting(2000, "Optimizer steps.", valid=at_least(1))
    overwrite: bool = setting(False, "Write into an existing non-empty folder.")

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class RehearsalModelConfig:
    """What ``ggpo build-rehearsal-model`` builds and where (the recipe in `rehearsal.py`)."""

    out: Path = setting(help="Folder to write the model into.")
    seed: int = setting(
        0, "Seed of the tokenizer's text draw, the initial weights and the training order.", valid=at_least(0)
    )
    overwrite: bool = setting(False, "Write into an existing non-empty folder.")

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class StylesConfig:
    """What ``ggpo measure-styles`` samples and where it writes the full report."""

    model: Path | None = setting(None, "Model folder [default: the embedded tiny model].")
    num_problems: int = setting(256, "Arith problems to sample.", valid=at_least(1))
    split: Split = setting("validation", "Arith split: design and tuning look at validation, never test.")
    n: int = setting(8, "Responses per problem.", valid=at_least(1))
    seed: int = setting(0, "Sampling seed.", valid=at_least(0))
    forced: bool = setting(True, "Also sample with each style forced.")
    json_out: Path | None = setting(None, "Also write the full report (per level) here.", flag="json")
    card: Path | None = setting(
        None,
        "Rewrite the measured section of this model card (docs/organism.md names the embedded one's).",
    )

    def __post_init__(self) -> None:
        check_settings(self)
