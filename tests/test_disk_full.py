"""A full disk during a pool, checkpoint or report write, made real by a file-size limit (RLIMIT_FSIZE):
one error line naming the file, the last good file kept, and the same command without the limit completes
as if nothing had happened."""

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import stopped_itself, synthetic_rows, write_synthetic_pool

from ggpo_offline.compare.manifest import MARKER
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.one_writer import WRITER_LOCK
from ggpo_offline.pool.partial import PROGRESS_FILE, PartCounts, PartialRun, partial_dir
from ggpo_offline.pool.schema import POOL_SCHEMA
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.train.distributed import STOP_VARIABLE
from ggpo_offline.train.run_folder import RunFolder

# Python ignores SIGXFSZ, so a write past the limit fails with EFBIG ("File too large") where one on a full
# disk fails with ENOSPC: the same refusal part-way through a file, without a small filesystem to mount.
TOO_LARGE = os.strerror(errno.EFBIG)

GGPO = str(Path(sys.executable).parent / "ggpo")
# One torch thread, as --threads 1 gives train and compare: on a loaded 2-core machine generate-pool's
# threads waiting for a core made it take 1 min 58 s instead of 10 s.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
# The chaos run's pool, halved: 9 of its 24 groups have mixed rewards, enough for 4 updates x 2 groups.
POOL = [
    "generate-pool", "--engine", "hf", "--dtype", "float32", "--num-prompts", "24", "-m", "4",
    "--max-tokens", "48", "--reward-workers", "0", "--batch-prompts", "6",
]  # fmt: skip
TRAIN = [
    "train", "--method", "grpo", "--updates", "4", "--groups-per-batch", "2", "--save-every", "2",
    "--no-tracking", "--threads", "1",
]  # fmt: skip
COMPARE = [
    "compare", "--methods", "grpo", "--seeds", "1", "--updates", "2", "--groups-per-batch", "2",
    "--eval-every", "2", "--eval-n", "2", "--eval-k", "1,2", "--eval-num-problems", "4", "--no-test",
    "--eval-engine", "hf", "--no-tracking", "--threads", "1",
]  # fmt: skip


def ggpo(args: list[str], limit: int | None = None) -> subprocess.CompletedProcess:
    """The command in a new process whose files may not grow past ``limit`` bytes (None: no limit)."""
    limited = None if limit is None else lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run(
        [GGPO, *args], capture_output=True, text=True, timeout=600, env=ONE_THREAD, preexec_fn=limited
    )


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """This process's files may not grow past ``limit`` bytes while the block runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def assert_refused(returncode: int, stderr: str, line: str) -> None:
    """The command ended with ``line`` as its one error line, after its progress output, no traceback."""
    assert returncode == 1, stderr
    assert [x for x in stderr.splitlines() if x.startswith("error:")] == [line], stderr
    assert stderr.splitlines()[-1] == line and "Traceback" not in stderr, stderr


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def report_files(folder: Path) -> dict[str, bytes]:
    """The files of a report folder, its runs and the compare's lock (it names the compare's pid) aside."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != WRITER_LOCK}


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    """The pool of `POOL`, generated without a limit."""
    out = tmp_path_factory.mktemp("pool") / "whole.parquet"
    done = ggpo([*POOL, "--out", str(out)])
    assert done.returncode == 0, done.stderr
    return out


# --- the pool ------------------------------------------------------------------------------------------


def test_a_part_the_disk_refuses_is_one_line_naming_it_and_leaves_nothing(tmp_path):
    partial = PartialRun(tmp_path / "pool.parquet", settings={})
    rows = pa.Table.from_pylist(synthetic_rows(groups=3, m=4), schema=POOL_SCHEMA)
    part = partial.dir / "part-000000.parquet"
    with file_size_limit(1000), pytest.raises(UserError, match=rf"^cannot write {part}: {TOO_LARGE}$"):
        partial.add_part(rows, PartCounts(seconds=1.0))
    assert list(partial.dir.iterdir()) == [] and partial.parts == ()  # no temporary file, no record
    partial.add_part(rows, PartCounts(seconds=1.0))  # room again: the same part is stored
    assert sorted(p.name for p in partial.dir.iterdir()) == [part.name, PROGRESS_FILE]


def test_generate_pool_on_a_full_disk_keeps_the_earlier_pool_and_resumes(pool, tmp_path):
    out = tmp_path / "pool.parquet"
    before = write_synthetic_pool(out, groups=3).read_bytes()  # the user's earlier pool, --overwrite given
    command = [*POOL, "--overwrite", "--out", str(out)]

    # Each batch's part holds a quarter of the pool's rows: every part is stored, the pool is refused.
    refused = ggpo(command, limit=pool.stat().st_size // 2)
    assert_refused(refused.returncode, refused.stderr, f"error: cannot write {out}: {TOO_LARGE}")
    stored = json.loads((partial_dir(out) / PROGRESS_FILE).read_text())["parts"]
    assert [part["file"] for part in stored] == [f"part-00000{i}.parquet" for i in range(4)]
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [partial_dir(out).name, out.name]  # no temp file

    resumed = ggpo(command)
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(pool))
    # The stored parts' own sampling times: the pool was made of them, nothing was sampled again.
    assert read_pool_info(out).raw["generation_seconds"] == round(sum(p["seconds"] for p in stored), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


# --- checkpoints and metrics.jsonl ---------------------------------------------------------------------


@pytest.mark.parametrize("refused", ["weights", "resume state"])
def test_a_checkpoint_the_disk_refuses_is_one_line_and_keeps_the_earlier_one(tiny_dir, tmp_path, refused):
    """safetensors and torch.save raise no OSError for a refused write: the storage tells what happened."""
    import torch
    from transformers import AutoModelForCausalLM

    from ggpo_offline.core.model_io import load_tokenizer
    from ggpo_offline.train.checkpoint import RunState, save_checkpoint

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_dir), load_tokenizer(tiny_dir)
    moments = {key: {n: torch.zeros_like(p) for n, p in model.named_parameters()} for key in ("m", "v")}
    state = RunState(2, moments, [], None, None, {}, 1)  # Adam's two moments: twice the weights
    path = tmp_path / "checkpoints" / "update-000002"
    save_checkpoint(path, model, tokenizer, state)
    earlier = contents(path.parent)
    weights = (path / "model.safetensors").stat().st_size
    limit = {"weights": weights // 2, "resume state": weights * 3 // 2}[refused]
    with file_size_limit(limit), pytest.raises(UserError) as error:
        save_checkpoint(path, model, tokenizer, state)
    assert str(error.value) == f"cannot write checkpoint {path}: {TOO_LARGE}"
    assert contents(path.parent) == earlier  # no temporary folder beside it


def test_a_resume_on_a_full_disk_keeps_every_metrics_record(tmp_path):
    """--resume from update 2 rewrites metrics.jsonl without updates 2-3; a refused rewrite loses nothing."""
    folder = RunFolder(tmp_path)
    folder.append_metrics([{"update": update, "loss": 0.5} for update in range(4)])
    before = folder.metrics_file.read_bytes()
    message = rf"^cannot write {folder.metrics_file}: {TOO_LARGE}$"
    with file_size_limit(len(before) // 4), pytest.raises(UserError, match=message):
        folder.keep_metrics_before(2)
    assert folder.metrics_file.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [folder.metrics_file.name]  # no temporary file
    assert folder.keep_metrics_before(2) == [{"update": 0, "loss": 0.5}, {"update": 1, "loss": 0.5}]


@pytest.fixture(scope="module")
def whole_run(pool, tmp_path_factory) -> Path:
    """`TRAIN` on the pool, uninterrupted."""
    out = tmp_path_factory.mktemp("whole") / "run"
    done = ggpo([*TRAIN, "--pool", str(pool), "--out", str(out)])
    assert done.returncode == 0, done.stderr
    return out


def test_train_on_a_full_disk_keeps_the_last_checkpoint_and_resumes_to_the_same_run(
    pool, whole_run, tmp_path
):
    """The disk fills after the checkpoint of update 2: the job stops itself at update 3, gets its limit and
    goes on; the metrics of updates 2-3 are refused, whole lines kept (a refused checkpoint: the test above).
    --resume then gives the uninterrupted run, byte for byte."""
    run = tmp_path / "run"
    command = [*TRAIN, "--pool", str(pool), "--out", str(run)]
    log = tmp_path / "job.log"  # a file, not a pipe: a full pipe would block the run before its stop
    with open(log, "w") as stderr:
        stop = {**ONE_THREAD, STOP_VARIABLE: "0:training update 3"}
        job = subprocess.Popen([GGPO, *command], env=stop, stderr=stderr)
    try:
        stopped_itself(job, log)
        kept, metrics = contents(run / "checkpoints"), (run / "metrics.jsonl").read_bytes()
        limit = len(metrics) + 10  # 10 bytes: a torn line
        resource.prlimit(job.pid, resource.RLIMIT_FSIZE, (limit, limit))
    finally:
        job.send_signal(signal.SIGCONT)
    job.wait(timeout=600)
    line = f"error: cannot write {run / 'metrics.jsonl'}: {TOO_LARGE}"
    assert_refused(job.returncode, log.read_text(), line)
    assert contents(run / "checkpoints") == kept  # update 2's, byte for byte
    assert RunFolder(run).latest_checkpoint() == run / "checkpoints" / "update-000002"
    assert (run / "metrics.jsonl").read_bytes() == metrics  # whole lines only: none torn

    resumed = ggpo([*command, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert (run / "metrics.jsonl").read_bytes() == (whole_run / "metrics.jsonl").read_bytes()
    final = "final/model.safetensors"
    assert (run / final).read_bytes() == (whole_run / final).read_bytes()


# --- the compare report --------------------------------------------------------------------------------


def _undated(data: bytes) -> bytes:
    """A report file without the lines that date it (README.md, report.json, compare.json)."""
    dated = (b"Written by ggpo-offline", b'"updated": ')
    return b"\n".join(line for line in data.split(b"\n") if not any(d in line for d in dated))


def test_compare_on_a_full_disk_keeps_the_earlier_report_and_rewrites_it(pool, tmp_path):
    report = tmp_path / "report"
    command = [*COMPARE, "--pool", str(pool), "--out", str(report)]
    first = ggpo(command)  # trains grpo-s1 and writes the report
    assert first.returncode == 0, first.stderr
    earlier = report_files(report)
    largest = max(earlier, key=lambda name: len(earlier[name]))  # figure.png, with every panel

    refused = ggpo(command, limit=len(earlier[largest]) // 2)  # reuses the run, then writes the report
    assert_refused(refused.returncode, refused.stderr, f"error: cannot write {report / largest}: {TOO_LARGE}")
    after = report_files(report)
    assert after.keys() == earlier.keys()  # no temporary file left
    assert [name for name in earlier if after[name] != earlier[name]] == [MARKER]  # its status: running

    rewritten = ggpo(command)
    assert rewritten.returncode == 0, rewritten.stderr
    written = report_files(report)
    assert written.keys() == earlier.keys() and json.loads(written[MARKER])["status"] == "finished"
    # The first report again, but for its dates and the run it now reused instead of training.
    reused = {
        n: _undated(d).replace(b"| trained |", b"| reused |").replace(b'"trained"', b'"reused"')
        for n, d in earlier.items()
        if n != MARKER
    }
    assert [name for name in reused if _undated(written[name]) != reused[name]] == []
