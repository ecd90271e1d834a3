"""A run's life: its folder prepared or resumed, its MLflow run, its metrics flushed to the tracker and to
metrics.jsonl together, its result written last, and a failure turned into the line saying how to resume."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ggpo_offline.core.errors import JobFailure
from ggpo_offline.train.config import Timeouts, TrainConfig
from ggpo_offline.train.metric_names import MISMATCH_ESS_BLOCK, UPDATE
from ggpo_offline.train.profile import RunProfile
from ggpo_offline.train.run_folder import RunFolder, folder_action, resume_hint
from ggpo_offline.train.run_records import CONFIG_FILE, RunResult, RunSettings

if TYPE_CHECKING:  # the trainer's modules import torch; reading a finished run must not
    from ggpo_offline.train.distributed import Ranks
    from ggpo_offline.train.run_inputs import Fingerprints

FLUSH_EVERY = 20
"""Without checkpoints, metrics still reach the tracker and metrics.jsonl this often (updates)."""


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
            path.mkdir(parents=True, exist_ok=True)
            if exists and not resume:
                self.folder.clear()
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
