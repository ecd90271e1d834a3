"""Full disks and unwritable outputs: one error line naming the path, no temp files, earlier results kept."""

import errno
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from conftest import synthetic_footer, synthetic_rows, write_synthetic_pool

from ggpo_offline.core.errors import UserError, write_json
from ggpo_offline.pool.validate import validate_pool
from ggpo_offline.pool.writer import PoolWriter
from ggpo_offline.train import checkpoint
from ggpo_offline.train.checkpoint import RunState, save_checkpoint

ROOT = os.geteuid() == 0  # root writes into read-only folders, so chmod cannot make one here


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def read_only_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    """Names in ``folder`` other than ``keep``: temporary files a failed write left behind."""
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


# --- the pool writer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("failing", ["write_table", "close"])
def test_pool_writer_on_a_full_disk_keeps_the_earlier_pool(tmp_path, monkeypatch, failing):
    path = write_synthetic_pool(tmp_path / "pool.parquet", groups=3)
    before = path.read_bytes()
    monkeypatch.setattr(pq.ParquetWriter, failing, disk_full)
    with pytest.raises(UserError, match=rf"^cannot write {path}: No space left on device$"):
        with PoolWriter(path, overwrite=True) as writer:
            writer.write_rows(synthetic_rows(2, 4, seed=1))
            writer.close(synthetic_footer(4))
    monkeypatch.undo()
    assert path.read_bytes() == before and validate_pool(path).groups == 3
    assert leftovers(tmp_path, {"pool.parquet"}) == []


def test_pool_writer_failure_cleans_up_without_a_with_block(tmp_path, monkeypatch):
    path = tmp_path / "pool.parquet"
    writer = PoolWriter(path)
    writer.write_rows(synthetic_rows(2, 4))
    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(UserError, match="No space left on device"):
        writer.close(synthetic_footer(4))
    assert list(tmp_path.iterdir()) == []


def test_pool_writer_into_a_file_or_a_read_only_folder(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path}/a_file/pool.parquet: "):
        PoolWriter(tmp_path / "a_file" / "pool.parquet")
    if ROOT:
        pytest.skip("root may write into any folder, so the read-only case cannot fail here")
    folder = read_only_folder(tmp_path)
    with pytest.raises(UserError, match=rf"^cannot write {folder}/pool.parquet: Permission denied$"):
        PoolWriter(folder / "pool.parquet")


# --- JSON reports (ggpo eval --out, eval/update-N.json, result.json) ----------------------------------


def test_report_on_a_full_disk_keeps_the_earlier_report(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_json({"run": 1}, path)
    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(UserError, match=rf"^cannot write {path}: No space left on device$"):
        write_json({"run": 2}, path)
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"run": 1}
    assert leftovers(tmp_path, {"report.json"}) == []


def test_report_into_a_file_or_a_read_only_folder(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path}/a_file/report.json: "):
        write_json({}, tmp_path / "a_file" / "report.json")
    if ROOT:
        pytest.skip("root may write into any folder, so the read-only case cannot fail here")
    folder = read_only_folder(tmp_path)
    with pytest.raises(UserError, match="Permission denied"):
        write_json({}, folder / "report.json")


# --- checkpoints ---------------------------------------------------------------------------------------


class FakeModel:
    """Stands in for a model or tokenizer: ``save_pretrained`` writes one file, or fails as told."""

    def __init__(self, content: str, error: BaseException | None = None):
        self.content, self.error = content, error

    def save_pretrained(self, folder: Path, state_dict=None) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "weights.txt").write_text(self.content)
        if self.error is not None:
            raise self.error


def _state(update: int) -> RunState:
    return RunState(update, None, [], None, None, {}, 1)


def test_checkpoint_replaces_the_earlier_one_without_leftovers(tmp_path):
    path = tmp_path / "checkpoints" / "update-000002"
    save_checkpoint(path, FakeModel("old"), FakeModel("old"), _state(1))
    save_checkpoint(path, FakeModel("new"), FakeModel("new"), _state(2))
    assert (path / "weights.txt").read_text() == "new"
    assert leftovers(path.parent, {path.name}) == []


@pytest.mark.parametrize(
    ("error", "free_bytes"),
    [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 10**12),
        # What torch.save and safetensors raise when the disk fills up: not an OSError.
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"), 0),
    ],
    ids=["oserror", "torch-runtimeerror"],
)
def test_checkpoint_on_a_full_disk_keeps_the_earlier_one(tmp_path, monkeypatch, error, free_bytes):
    path = tmp_path / "checkpoints" / "update-000002"
    save_checkpoint(path, FakeModel("old"), FakeModel("old"), _state(2))
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda folder: SimpleNamespace(free=free_bytes))
    with pytest.raises(UserError, match=rf"^cannot write checkpoint {path}: No space left on device$"):
        save_checkpoint(path, FakeModel("new", error), FakeModel("new"), _state(2))
    assert (path / "weights.txt").read_text() == "old"
    assert leftovers(path.parent, {path.name}) == []


def test_checkpoint_bug_with_free_space_is_not_disguised_as_a_full_disk(tmp_path):
    path = tmp_path / "update-000001"
    with pytest.raises(RuntimeError, match="a bug"):
        save_checkpoint(path, FakeModel("x", RuntimeError("a bug")), FakeModel("x"), None)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_into_a_file(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match=rf"^cannot write checkpoint {tmp_path}/a_file/update-000001: "):
        save_checkpoint(tmp_path / "a_file" / "update-000001", FakeModel("x"), FakeModel("x"), None)


# --- the π0 cache --------------------------------------------------------------------------------------


def test_pi0_cache_on_a_full_disk_leaves_no_partial_cache(tmp_path, monkeypatch, tiny_dir):
    import torch

    from ggpo_offline.train.pi0_cache import score_pool
    from ggpo_offline.train.pool_index import check_pool

    rows = synthetic_rows(groups=3, m=4)
    for row in rows:
        row["reward"] = float(row["sample_idx"] % 2)  # mixed groups: the ones the cache scores
    pool = write_synthetic_pool(tmp_path / "pool.parquet", rows=rows, m=4)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path}/pool\.pi0-\w+\.parquet: No space left"):
        score_pool(check_pool(pool), tiny_dir, torch.device("cpu"), 1.0)
    assert leftovers(tmp_path, {"pool.parquet"}) == []


# --- the CLI -------------------------------------------------------------------------------------------


def test_any_other_os_error_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    from ggpo_cli.main import main

    from ggpo_offline.pool import validate

    def unreadable(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(validate, "validate_pool", unreadable)
    monkeypatch.setattr(sys, "argv", ["ggpo", "pool", "validate", str(tmp_path / "p.parquet")])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 1
    assert capsys.readouterr().err == f"error: [Errno 13] Permission denied: '{tmp_path}/p.parquet'\n"
