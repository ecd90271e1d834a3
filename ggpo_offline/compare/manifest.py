"""compare.json, the manifest of a compare report folder: what the compare ran, how far it got and which
run folders it used. `ggpo compare` writes it; the arc and tuning reports read a part's runs from it."""

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ggpo_offline.core.errors import read_versioned, write_json
from ggpo_offline.train.run_records import RunId

MARKER = "compare.json"
"""A folder holding it is a comparison report: compare writes into no other non-empty folder."""


@dataclass(frozen=True)
class ManifestRun:
    """One run of the compare: its folder and what the compare did with it (train, reuse, resume...)."""

    folder: str
    action: str


@dataclass(frozen=True)
class CompareManifest:
    """compare.json, led by its "format" (`FORMATS`; format 1, without the key, held the same fields, as
    the reports committed before it do). ``to_dict`` writes the keys in this order."""

    FORMATS: ClassVar[tuple[int, ...]] = (1, 2)
    status: str
    """Where the compare is: planned, training, reporting, done (or failed)."""
    tool_version: str
    updated: str
    """When the manifest was last written (UTC, ISO 8601 to the second)."""
    command: str
    """The command that reproduces the report."""
    pool: str
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    runs: dict[str, ManifestRun]
    """Run name (`RunId.folder_name`) -> the run."""
    data_order_fingerprints: dict[str, str]
    """Seed (as text) -> the data order its runs shared; empty until the runs are checked."""

    def to_dict(self) -> dict:
        return {
            "format": self.FORMATS[-1],
            "status": self.status,
            "tool_version": self.tool_version,
            "updated": self.updated,
            "command": self.command,
            "pool": self.pool,
            "methods": list(self.methods),
            "seeds": list(self.seeds),
            "runs": {name: {"folder": run.folder, "action": run.action} for name, run in self.runs.items()},
            "data_order_fingerprints": dict(self.data_order_fingerprints),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "CompareManifest":
        return cls(
            status=data["status"],
            tool_version=data["tool_version"],
            updated=data["updated"],
            command=data["command"],
            pool=data["pool"],
            methods=tuple(data["methods"]),
            seeds=tuple(data["seeds"]),
            runs={name: ManifestRun(run["folder"], run["action"]) for name, run in data["runs"].items()},
            data_order_fingerprints=dict(data["data_order_fingerprints"]),
        )

    def write(self, report_dir: Path) -> None:
        write_json(self.to_dict(), Path(report_dir) / MARKER)

    @classmethod
    def read(cls, report_dir: Path) -> "CompareManifest":
        """The manifest of ``report_dir``; UserError when the folder holds none."""
        missing = f"{report_dir}: no {MARKER}; give folders written by ggpo compare"
        return cls.from_dict(read_versioned(Path(report_dir) / MARKER, cls.FORMATS, missing))

    def run_folders(self) -> dict[RunId, Path]:
        """Each run the compare lists, by its id, and its folder."""
        return {RunId.parse(name): Path(run.folder) for name, run in self.runs.items()}
