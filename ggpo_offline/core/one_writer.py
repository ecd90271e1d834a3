"""One writer a folder: an exclusive lock that dies with its process, and the folder's files around it."""

import fcntl
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ggpo_offline.core.errors import UserError, writing

WRITER_LOCK = ".writer"
"""Locked by the one process that writes the folder, and naming it (host, pid); not part of what it holds."""


def holds_only_the_lock(folder: Path) -> bool:
    """Whether ``folder`` is absent or holds nothing but its writer's lock."""
    return not folder.exists() or not any(p.name != WRITER_LOCK for p in folder.iterdir())


def clear_but_the_lock(folder: Path) -> None:
    """Remove everything in ``folder`` except its writer's lock, which stays held."""
    for entry in folder.iterdir():
        if entry.name == WRITER_LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@contextmanager
def one_writer(
    folder: Path,
    main: bool = True,
    rule: str = "a run folder has one writer",
    then: str = "--resume",
    temporary: bool = False,
) -> Iterator[None]:
    """Hold ``folder`` for this process alone while the block writes it: an exclusive `flock` on its
    WRITER_LOCK file, which the kernel lets go when the block ends or the process dies however it dies. A
    second writer — the same command typed in another terminal, or a Slurm task requeued while its
    predecessor is still being killed — is refused with one line naming the holder, and the folder is left as
    it was. Only the main rank of a job (``main``) takes it: the job is the one writer. ``rule``, ``then``:
    the refusal's words. A folder this block made, or a ``temporary`` one (a pool's resume state), is removed
    when the block leaves nothing but the lock in it; removed while still held, so no second writer takes a
    lock that is about to vanish."""
    if not main:
        yield
        return
    path = Path(folder)
    created = not path.exists()
    with writing(path / WRITER_LOCK):  # an unwritable or full place: one line naming it
        path.mkdir(parents=True, exist_ok=True)
        lock = open(path / WRITER_LOCK, "a+")
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise UserError(
                f"{path} is being written by {holder}; {rule}: let it finish (or stop it), then {then}"
            ) from None
        try:
            with writing(path / WRITER_LOCK):
                lock.seek(0)
                lock.truncate()
                lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
                lock.flush()
            yield
        finally:
            if (created or temporary) and holds_only_the_lock(path):
                shutil.rmtree(path, ignore_errors=True)  # nothing written: leave no folder behind
