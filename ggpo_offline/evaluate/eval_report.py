"""The evaluation report: what `ggpo eval --out` and training's checkpoint evaluations write
(``eval/update-*.json``), and what training, compare and the CLI read back, through this one type."""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.evaluate.benchmark_scores import BenchmarkScores, Scores
from ggpo_offline.generate.engines.base import SamplingSettings

AS_WRITTEN = ("engine", "dtype", "reward", "dataset_seed", "tool_version")
"""The settings a report writes after its prompt template, each as it is."""
SEED_DERIVATION = "per prompt: sha256('{seed}:{prompt_id}'), engine adds the sample index"


@dataclass(frozen=True)
class EvaluatedModel:
    """The model an evaluation ran: its folder, its name and its weights' sha256."""

    path: str
    name: str
    weights_sha256: str


@dataclass(frozen=True)
class EvalSettings:
    """Where an evaluation's numbers come from, as its report writes them (``to_dict``, key for key)."""

    model: EvaluatedModel
    sampling: SamplingSettings
    pool: str | None
    """The pool the sampling settings came from, if any."""
    engine: dict
    """name and version."""
    dtype: str
    reward: dict
    """The answer rule, verifier and its timeouts and errors (`rewards`)."""
    dataset_seed: int
    tool_version: str
    prompt_template: dict | None = None
    """What prompted the model (`prompts.template_description`); None in reports written before it was
    recorded."""

    def to_dict(self) -> dict:
        written = {
            "model": asdict(self.model),
            "sampling": {**self.sampling.as_dict(), "seed_derivation": SEED_DERIVATION},
            "pool": self.pool,
        }
        written |= {} if self.prompt_template is None else {"prompt_template": self.prompt_template}
        return written | {name: getattr(self, name) for name in AS_WRITTEN}

    @classmethod
    def from_dict(cls, data: dict) -> "EvalSettings":
        sampling = {f.name: data["sampling"][f.name] for f in fields(SamplingSettings)}
        found = {name: data[name] for name in ("pool", *AS_WRITTEN)}
        return cls(
            EvaluatedModel(**data["model"]),
            SamplingSettings(**sampling),
            prompt_template=data.get("prompt_template"),
            **found,
        )


@dataclass(frozen=True)
class EvalReport:
    """One model evaluated on a suite of benchmarks. ``to_dict`` gives the JSON as written, key for key and
    in order; ``from_dict`` reads it back (``EvalReport.from_dict(d).to_dict() == d``)."""

    n: int
    """Samples per problem (the n of mean@n)."""
    ks: tuple[int, ...]
    """The pass@k values reported, ascending (those ``<= n``)."""
    benchmarks: dict[str, BenchmarkScores]
    """Each benchmark's scores, in the order the datasets were given."""
    suite: Scores
    """Every benchmark's problems together, problem-weighted."""
    settings: EvalSettings
    """Provenance: model, sampling, pool, prompt template, engine, dtype, reward, dataset seed and tool
    version."""
    run: dict
    """When it ran, as written: created (ISO time) and seconds."""
    generated: dict | None = None
    """What the model generated (`generated.GeneratedText`): length, stop rate, NLL, novelty against the
    pool; None in reports written before it was recorded."""

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "ks": list(self.ks),
            "benchmarks": {name: scores.to_dict() for name, scores in self.benchmarks.items()},
            "suite": self.suite.to_dict(),
            "settings": self.settings.to_dict(),
            "run": self.run,
            **({} if self.generated is None else {"generated": self.generated}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "EvalReport":
        return cls(
            n=data["n"],
            ks=tuple(data["ks"]),
            benchmarks={name: BenchmarkScores.from_dict(s) for name, s in data["benchmarks"].items()},
            suite=Scores.from_dict(data["suite"]),
            settings=EvalSettings.from_dict(data["settings"]),
            run=data["run"],
            generated=data.get("generated"),
        )

    @classmethod
    def read(cls, path: Path) -> "EvalReport":
        """The report written to ``path`` (`write_json` of ``to_dict``)."""
        return cls.from_dict(json.loads(Path(path).read_text()))


def check_report_path(path: Path, overwrite: bool) -> None:
    """Refuse ``--out`` before any slow work when it is a folder or an existing file not to be replaced."""
    if path.is_dir():
        raise UserError(f"{path} is a directory; give a .json file path for --out")
    if path.exists() and not overwrite:
        raise UserError(f"{path} already exists; pass --overwrite to replace it")
