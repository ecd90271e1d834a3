"""A run folder and its life: where each file sits, preparing or resuming it, and metrics flushed to it and
to MLflow together, with the names of what it logs at evaluated checkpoints. Reading a finished run (report,
compare, CLI) needs only `RunFolder`, not torch."""

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ggpo_offline.core.errors import JobFailure, UserError
from ggpo_offline.evaluate.report import EvalReport
from ggpo_offline.train.config import Timeouts, TrainConfig
from ggpo_offline.train.metric_names import MISMATCH_ESS_BLOCK, UPDATE
from ggpo_offline.train.profile import PhaseTime, RunProfile
from ggpo_offline.train.records import CONFIG_FILE, RESULT_FILE, RunResult, RunSettings

if TYPE_CHECKING:  # the trainer's modules import torch; reading a finished run must not
    from ggpo_offline.train.distributed import Ranks
    from ggpo_offline.train.inputs import Fingerprints


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
    with path.open("a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def _reports_by_update(folder: Path) -> dict[int, EvalReport]:
    paths = sorted(folder.glob("update-*.json"))
    return {int(p.stem.removeprefix("update-")): EvalReport.read(p) for p in paths}


FLUSH_EVERY = 20
"""Without checkpoints, metrics still reach the tracker and metrics.jsonl this often (updates)."""


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
        return not self.path.exists() or not any(self.path.iterdir())

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
            self.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in kept))
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


class Run:
    """One training run: its folder (made, replaced or resumed), its tracker, and its metric records, which
    reach the tracker and metrics.jsonl together. Rank 0 alone writes; every rank takes part in the checks."""

    def __init__(
        self,
        config: TrainConfig,
        ranks: "Ranks | None" = None,
        *,
        resume: bool,
        overwrite: bool,
        profile: RunProfile | None = None,
    ):
        """``profile``: the run's phase times so far, written with its metrics from now on."""
        from ggpo_offline.train.distributed import SINGLE_PROCESS

        self.config, self.ranks = config, ranks or SINGLE_PROCESS
        self.profile = RunProfile() if profile is None else profile
        self.folder = RunFolder(config.run_dir)
        self._prepare(resume, overwrite)
        self.tracker = None
        self.history: list[dict] = []
        self.pending: list[dict] = []

    def _prepare(self, resume: bool, overwrite: bool) -> None:
        """A run folder is only reused on --resume and only replaced on --overwrite."""
        from ggpo_offline.train.distributed import barrier

        path, exists = self.folder.path, not self.folder.is_empty()
        folder_action(path, resume=resume, overwrite=overwrite)
        barrier(self.ranks)  # every rank has checked the folder before rank 0 changes it
        if self.ranks.main:
            if exists and not resume:
                shutil.rmtree(path)
            path.mkdir(parents=True, exist_ok=True)
        barrier(self.ranks)

    # -- tracking --------------------------------------------------------------------------------------
    def start(
        self,
        next_update: int,
        run_id: str | None,
        parent_run_id: str | None,
        fingerprints: "Fingerprints",
        params: dict,
    ) -> None:
        """Open the tracker (a new run, or the resumed ``run_id``) and take the metric history before
        ``next_update``. A new run logs the config and ``params``, tags its ``fingerprints``, package version
        and method, and writes config.json (config and fingerprints, what compare checks before reusing)."""
        from ggpo_offline import __version__
        from ggpo_offline.core import tracking

        config = self.config
        self.history = self.folder.keep_metrics_before(next_update) if self.ranks.main else []
        self.tracker = tracking.start_tracking(
            experiment=config.experiment or Path(config.pool).stem,
            run_name=config.run_name,
            tracking_uri=config.tracking_uri,
            resume_run_id=run_id,
            parent_run_id=parent_run_id,
            enabled=not config.no_tracking and self.ranks.main,
        )
        if run_id is None and self.ranks.main:
            self.tracker.log_params({**config.to_dict(), **params})
            self.tracker.set_tags(
                {**fingerprints.to_dict(), "ggpo_offline_version": __version__, "method": config.method}
            )
            self.tracker.log_dict(config.to_dict(), CONFIG_FILE)
            RunSettings.of(config, fingerprints.to_dict()).write(self.folder.path)

    @property
    def run_id(self) -> str | None:
        return None if self.tracker is None else self.tracker.run_id

    def record(self, update: int, evaluation: dict, metrics: dict | None = None, last: bool = False) -> None:
        """Keep the evaluation scores of ``update`` and its training metrics when it is a logged update (every
        --log-every updates, and the last); a block's ESS, which exists only at the block's end, is kept
        whatever the interval."""
        record = {UPDATE: update, **evaluation}
        if metrics is not None and (update % self.config.log_every == 0 or last):
            record.update(metrics)
        elif metrics is not None and MISMATCH_ESS_BLOCK in metrics:
            record[MISMATCH_ESS_BLOCK] = metrics[MISMATCH_ESS_BLOCK]
        if len(record) > 1:
            self.pending.append(record)

    def flush(self) -> None:
        """Send the kept records to the tracker and metrics.jsonl."""
        for record in self.pending:
            self.tracker.log_metrics({k: v for k, v in record.items() if k != UPDATE}, step=record[UPDATE])
        self.tracker.flush()
        if self.ranks.main:
            self.folder.append_metrics(self.pending)
        self._write_profile()
        self.history.extend(self.pending)
        self.pending = []

    def finish(self, final: Path, fingerprints: "Fingerprints", selected_update: int | None = None) -> None:
        """result.json, written last: the run is complete. ``selected_update``: the checkpoint the run reports
        (best validation score), None without evaluation."""
        from ggpo_offline.core import tracking

        if self.ranks.main:
            uri = (
                None
                if self.config.no_tracking
                else self.config.tracking_uri or tracking.default_tracking_uri()
            )
            result = RunResult(
                run_id=self.run_id,
                tracking_uri=uri,
                pool_fingerprint=fingerprints.pool_fingerprint,
                data_order_fingerprint=fingerprints.data_order_fingerprint,
                updates=self.config.updates,
                final_model=str(final),
                selected_update=selected_update,
            )
            self._write_profile()
            result.write(self.folder.path)

    def _write_profile(self) -> None:
        times = self.profile.take()
        if self.ranks.main:
            self.folder.append_profile(times)


@contextmanager
def failures_explained(run_dir: Path, ranks: "Ranks", timeouts: Timeouts) -> Iterator[None]:
    """A peer's death seen as a torch error becomes the job's one line; a failure says how to resume."""
    from ggpo_offline.train.distributed import launched_by_ggpo, lost_peer_failure, peer_lost

    try:
        yield
    except RuntimeError as error:
        if not (ranks.distributed and peer_lost(error)):
            raise
        raise lost_peer_failure(ranks, timeouts) from None
    except JobFailure as failure:
        if launched_by_ggpo():
            raise  # the launcher says where the job can resume, once
        raise JobFailure(f"{failure}; {resume_hint(run_dir)}") from None
