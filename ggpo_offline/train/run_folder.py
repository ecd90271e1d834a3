"""A run folder: where each file sits and how a finished run is read back (report, compare, CLI), without
torch; what a run does with an existing folder: train, resume or replace it."""

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ggpo_offline.core.errors import UserError, replace_text, writing
from ggpo_offline.core.one_writer import clear_but_the_lock, holds_only_the_lock
from ggpo_offline.evaluate.eval_report import EvalReport
from ggpo_offline.train.metric_names import UPDATE
from ggpo_offline.train.profile import PhaseTime
from ggpo_offline.train.run_records import CONFIG_FILE, RESULT_FILE, RunResult, RunSettings

# The names of a run folder's files and of a checkpoint's resume state (also read by `checkpoint`).
METRICS_FILE = "metrics.jsonl"
PROFILE_FILE = "profile.jsonl"
"""Wall seconds of each phase of the run (`train.profile`); never compared between runs."""
EVAL_FOLDER = "eval"
TEST_FOLDER = "test"
"""Inside EVAL_FOLDER: the held-out test evaluations, kept apart from the validation ones training reads."""
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "update-"
STATE_FILE = "trainer_state.pt"
"""Written last into a checkpoint: a checkpoint folder holding it is complete and resumable."""
FINAL = "final"


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append_jsonl(path: Path, records: list[dict]) -> None:
    """Append whole lines or none: a write the storage refuses part-way (disk full, file-size limit: a
    UserError naming ``path``) is cut back to where the file ended, so --resume never reads a torn line."""
    data = "".join(json.dumps(record) + "\n" for record in records).encode()
    with writing(path), open(path, "ab", buffering=0) as handle:
        end = handle.seek(0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):  # unbuffered: the kernel may take part of it, then refuse the rest
                written += handle.write(data[written:])
        except OSError:
            handle.truncate(end)
            raise


def _reports_by_update(folder: Path) -> dict[int, EvalReport]:
    paths = sorted(folder.glob("update-*.json"))
    return {int(p.stem.removeprefix("update-")): EvalReport.read(p) for p in paths}


@dataclass(frozen=True)
class RunFolder:
    """Where each file of a run lives, and how a finished run is read back."""

    path: Path

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def profile_file(self) -> Path:
        return self.path / PROFILE_FILE

    @property
    def result_file(self) -> Path:
        return self.path / RESULT_FILE

    @property
    def final(self) -> Path:
        return self.path / FINAL

    def checkpoint(self, update: int) -> Path:
        return self.path / CHECKPOINTS / f"{CHECKPOINT_PREFIX}{update:06d}"

    def eval_report(self, update: int) -> Path:
        """The in-training (validation) evaluation of ``update``."""
        return self.path / EVAL_FOLDER / f"update-{update:06d}.json"

    def test_report(self, update: int) -> Path:
        """The held-out test evaluation of ``update`` (the selected and the final checkpoint only)."""
        return self.path / EVAL_FOLDER / TEST_FOLDER / f"update-{update:06d}.json"

    def is_empty(self) -> bool:
        return holds_only_the_lock(self.path)

    def clear(self) -> None:
        """Remove every file of the run (`--overwrite`), keeping the writer's lock held."""
        clear_but_the_lock(self.path)

    def is_finished(self) -> bool:
        return self.result_file.is_file()

    def latest_checkpoint(self) -> Path | None:
        """The resumable checkpoint with the highest update number, if any."""
        folder = self.path / CHECKPOINTS
        if not folder.is_dir():
            return None
        found = sorted(p for p in folder.glob(f"{CHECKPOINT_PREFIX}*") if (p / STATE_FILE).is_file())
        return found[-1] if found else None

    def read_settings(self) -> RunSettings:
        """The settings and fingerprints the run was started with (none when it never got that far)."""
        return RunSettings.read(self.path)

    def read_result(self) -> RunResult:
        return RunResult.read(self.path)

    def read_metrics(self) -> list[dict]:
        return _read_jsonl(self.metrics_file)

    def read_profile(self) -> list[PhaseTime]:
        """The phase times the run has recorded ([] for a run that recorded none)."""
        return [PhaseTime(**record) for record in _read_jsonl(self.profile_file)]

    def read_evals(self) -> dict[int, EvalReport]:
        """In-training (validation) evaluation reports by update."""
        return _reports_by_update(self.path / EVAL_FOLDER)

    def read_tests(self) -> dict[int, EvalReport]:
        """Test evaluation reports by update ({} for a run that evaluated no test split)."""
        return _reports_by_update(self.path / EVAL_FOLDER / TEST_FOLDER)

    def append_metrics(self, records: list[dict]) -> None:
        _append_jsonl(self.metrics_file, records)

    def append_profile(self, times: list[PhaseTime]) -> None:
        _append_jsonl(self.profile_file, [asdict(phase_time) for phase_time in times])

    def keep_metrics_before(self, update: int) -> list[dict]:
        """Drop the records of ``update`` and later (a resumed run computes them again); the rest."""
        kept = [r for r in self.read_metrics() if r[UPDATE] < update]
        if self.metrics_file.is_file():
            # a refused write keeps every record
            replace_text(self.metrics_file, "".join(json.dumps(r) + "\n" for r in kept))
        return kept


def resume_hint(run_dir: Path) -> str:
    """What the user can do after the job stopped part-way: where ``--resume`` would continue from."""
    checkpoint = RunFolder(run_dir).latest_checkpoint()
    if checkpoint is None:
        return f"no checkpoint was saved yet: start it again with --overwrite (the run folder {run_dir})"
    update = int(checkpoint.name.removeprefix(CHECKPOINT_PREFIX))
    return f"the same command with --resume continues from update {update} ({checkpoint})"


def folder_action(run_dir: Path, *, resume: bool, overwrite: bool) -> str:
    """What a run does with its folder: train (empty or absent), resume or replace; refused when a run is
    there and neither ``resume`` nor ``overwrite`` says what to do with it, or ``resume`` finds none."""
    exists = not RunFolder(run_dir).is_empty()
    if exists and not resume and not overwrite:
        raise UserError(
            f"{run_dir} already exists; pass --resume to continue it or --overwrite to replace it"
        )
    if resume and not exists:
        raise UserError(f"--resume: {run_dir} holds no run to resume")
    return "resume" if resume else "replace" if exists else "train"


TRACKING_SETTINGS = ("tracking_uri", "experiment", "no_tracking")
"""Where a run was logged: never a reason to refuse reusing or resuming it."""


def settings_differences(saved_run: RunSettings, expected_run: RunSettings, defaults: dict) -> str:
    """The settings in which a saved run differs from the one wanted, as ``name: saved -> wanted``.

    Where a run was logged does not change its results, and a setting the run predates counts as
    matching when the wanted value is that setting's default (in ``defaults``: the run behaved as it does).
    """
    saved, expected = saved_run.values, expected_run.values
    missing = object()
    differing = []
    for key in sorted(set(saved) | set(expected)):
        old, new = saved.get(key, missing), expected.get(key, missing)
        if key in TRACKING_SETTINGS or old == new:
            continue
        if old is missing and key in defaults and new == defaults[key]:
            continue
        differing.append(
            f"{key}: {'unset' if old is missing else old} -> {'unset' if new is missing else new}"
        )
    return ", ".join(differing)


def continuing_action(run_dir: Path, expected: RunSettings, defaults: dict, *, rerun: bool = False) -> str:
    """What carries a run on from whatever state its folder is in — what a job that may be requeued does
    (``--resume-if-any``) and what compare plans: train an empty folder, reuse a finished run, resume from
    the last checkpoint, replace a run stopped before its first one (or every run, with ``rerun``). A folder
    holding a run of other settings (``expected``: RunSettings.of the run wanted) is refused."""
    folder = RunFolder(run_dir)
    if folder.is_empty():
        return "train"
    if rerun:
        return "replace"
    differing = settings_differences(folder.read_settings(), expected, defaults)
    if differing:
        raise UserError(
            f"{folder.path} holds a run with other settings or another pool ({differing}); pass --rerun to "
            "replace it or --out to report elsewhere"
        )
    if folder.is_finished():
        return "reuse"
    return "resume" if folder.latest_checkpoint() is not None else "replace"
