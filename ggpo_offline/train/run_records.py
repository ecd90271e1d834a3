"""The records of a run that other packages read, each written and read through one type: the run's id
(its folder's name), its settings (config.json) and its result (result.json)."""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ggpo_offline.core.errors import UserError, stored_format, write_json

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
"""Written last: a run folder holding it is a finished run (compare reuses such runs)."""
SEED_MARK = "-s"
"""Between a run's method and its seed in the run's name (`RunId.folder_name`)."""


@dataclass(frozen=True)
class RunId:
    """Which run of a comparison: its learner and its seed, named ``<method>-s<seed>`` (its folder, its
    MLflow run, its entry in compare.json)."""

    method: str
    seed: int

    @property
    def folder_name(self) -> str:
        return f"{self.method}{SEED_MARK}{self.seed}"

    @classmethod
    def parse(cls, name: str) -> "RunId":
        """The run a folder name names; UserError for a name no run folder has."""
        method, mark, seed = name.rpartition(SEED_MARK)
        if not (method and mark and seed.isdigit()):
            raise UserError(f"{name!r} is not a run's name: <method>{SEED_MARK}<seed>, e.g. grpo{SEED_MARK}1")
        return cls(method, int(seed))


class StoredConfig(Protocol):
    """A config that stores as JSON: a TrainConfig (`train.config` imports this module, so not by name)."""

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class RunSettings:
    """config.json: the TrainConfig a run started with (`TrainConfig.to_dict`) and its data fingerprints,
    which compare checks before reusing the run and the reports quote.

    Kept as the stored values, not a TrainConfig: a run folder written by an older version may hold a
    setting since removed or lack one since added, and it still reads (a missing setting reads as None).
    The file leads with its "format" (`FORMATS`; format 1, without the key, held the same values).
    """

    FORMATS: ClassVar[tuple[int, ...]] = (1, 2)
    values: dict[str, Any]
    """Setting (TrainConfig field) or fingerprint name -> its JSON value, in the order written."""

    @classmethod
    def of(cls, config: StoredConfig, fingerprints: dict[str, str]) -> "RunSettings":
        """What a run of ``config`` on data with ``fingerprints`` (`Fingerprints.to_dict`) writes."""
        return cls({**config.to_dict(), **fingerprints})

    def write(self, run_dir: Path) -> None:
        (Path(run_dir) / CONFIG_FILE).write_text(
            json.dumps({"format": self.FORMATS[-1], **self.values}, indent=2)
        )

    @classmethod
    def read(cls, run_dir: Path) -> "RunSettings":
        """The settings ``run_dir`` was started with (none when it never got that far)."""
        path = Path(run_dir) / CONFIG_FILE
        if not path.is_file():
            return cls({})
        stored = json.loads(path.read_text())
        stored_format(stored, cls.FORMATS, path)
        return cls({name: value for name, value in stored.items() if name != "format"})

    def only(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The values of ``names``, each None where the run has none."""
        return {name: self.values.get(name) for name in names}

    def without(self, names: tuple[str, ...]) -> dict[str, Any]:
        """Every stored value but those of ``names``."""
        return {name: value for name, value in self.values.items() if name not in names}

    @property
    def pool(self) -> str | None:
        return self.values.get("pool")

    @property
    def method(self) -> str | None:
        return self.values.get("method")

    @property
    def sync_every(self) -> int | None:
        """N: None for a run that replayed its pool offline."""
        return self.values.get("sync_every")

    @property
    def pool_fingerprint(self) -> str | None:
        """The pool the run started from (its round 0's, for a run that sampled rounds)."""
        return self.values.get("pool_fingerprint")

    @property
    def data_order_fingerprint(self) -> str | None:
        return self.values.get("data_order_fingerprint")

    @property
    def no_test(self) -> bool:
        return bool(self.values.get("no_test"))

    @property
    def lr(self) -> float | None:
        return self.values.get("lr")

    @property
    def ref_refresh(self) -> int | None:
        """T_ref: None for a learner that keeps π0 as its reference."""
        return self.values.get("ref_refresh")

    @property
    def updates(self) -> int | None:
        return self.values.get("updates")

    @property
    def groups_per_batch(self) -> int | None:
        return self.values.get("groups_per_batch")

    @property
    def beta(self) -> float | None:
        return self.values.get("beta")

    @property
    def eval_every(self) -> int | None:
        return self.values.get("eval_every")

    @property
    def eval_n(self) -> int | None:
        return self.values.get("eval_n")

    @property
    def eval_num_problems(self) -> int | None:
        return self.values.get("eval_num_problems")

    @property
    def test_num_problems(self) -> int | None:
        return self.values.get("test_num_problems")


@dataclass(frozen=True)
class RunResult:
    """result.json, written last by a finished run (`Run.finish`) and read by compare. A key missing from
    the file (an older or hand-written one) reads as None; ``to_dict`` writes every key, in this order.
    The file leads with its "format" (`FORMATS`; format 1, without the key, held the same fields)."""

    FORMATS: ClassVar[tuple[int, ...]] = (1, 2)
    run_id: str | None = None
    """The MLflow run; None when not tracked."""
    tracking_uri: str | None = None
    """The MLflow store the run was logged to; None with --no-tracking."""
    pool_fingerprint: str | None = None
    data_order_fingerprint: str | None = None
    updates: int | None = None
    final_model: str | None = None
    """The folder of the final weights."""
    selected_update: int | None = None
    """The checkpoint the run reports (best validation mean@n, the earliest among equals); None without
    evaluation."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunResult":
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    def write(self, run_dir: Path) -> None:
        """Through a temporary file renamed into place: a run folder holding result.json is finished."""
        write_json({"format": self.FORMATS[-1], **self.to_dict()}, Path(run_dir) / RESULT_FILE)

    @classmethod
    def read(cls, run_dir: Path) -> "RunResult":
        path = Path(run_dir) / RESULT_FILE
        stored = json.loads(path.read_text())
        stored_format(stored, cls.FORMATS, path)
        return cls.from_dict(stored)


def best_update(means: dict[int, float]) -> int:
    """The selection rule (`RunResult.selected_update`): the update of the best validation mean, the
    earliest among equals (a later update must do better to be chosen)."""
    return max(sorted(means), key=lambda update: (means[update], -update))
