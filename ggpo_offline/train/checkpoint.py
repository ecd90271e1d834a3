"""Checkpoints: Hugging Face folders (loadable by vLLM) plus the state needed to resume exactly."""

import os
import shutil
from pathlib import Path

import torch

STATE_FILE = "trainer_state.pt"
PREFIX = "update-"


def checkpoint_dir(run_dir: Path, update: int) -> Path:
    return run_dir / "checkpoints" / f"{PREFIX}{update:06d}"


def save_checkpoint(path: Path, model, tokenizer, state: dict | None) -> Path:
    """Write into a temporary folder, then rename it into place: a crash mid-save keeps the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if state is not None:
        torch.save(state, tmp / STATE_FILE)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The resumable checkpoint with the highest update number, if any."""
    folder = run_dir / "checkpoints"
    found = (
        sorted(p for p in folder.glob(f"{PREFIX}*") if (p / STATE_FILE).is_file()) if folder.is_dir() else []
    )
    return found[-1] if found else None


def load_state(path: Path) -> dict:
    return torch.load(path / STATE_FILE, weights_only=False)
