"""`make gpu-check` in its reduced CPU mode: every section runs and reports, so the GPU script cannot rot."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ggpo_offline.train.learners import LEARNERS

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def test_cpu_mode_runs_every_section_and_writes_the_report(tmp_path):
    out = tmp_path / "gpu-results.md"
    command = [sys.executable, str(SCRIPT), "--cpu", "--out", str(out), "--tmp", str(tmp_path / "work")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = out.read_text()
    sections = [
        "## 1. Learners",
        "## 2. The log-prob path",
        "## 3. Learner step",
        "## 4. A short `ggpo train`",
    ]
    assert all(section in report for section in sections)
    assert all(f"| {name} |" in report for name in LEARNERS)  # each learner checked against fp64
    paths = [
        "trainer (packed, chunked head)",
        "length-sorted padded",
        "straightforward (padded, full vocabulary)",
    ]
    assert all(f"| {path} |" in report for path in paths)
    assert "- vs the full path" in report and "- vs the length-sorted path" in report
    assert "2 updates in" in report and "ESS 1.0000" in report


def test_without_a_gpu_the_full_mode_stops_with_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the full mode runs there")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.md")], capture_output=True, text=True
    )
    assert (
        done.returncode == 1
        and done.stderr.strip() == "error: no CUDA device; run with --cpu for the reduced check"
    )
    assert not (tmp_path / "x.md").exists()
