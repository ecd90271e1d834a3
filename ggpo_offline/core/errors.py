"""The one exception type for bad user input or environment, and helpers that keep its message one line
(and a failed write from leaving a half-written file)."""

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


def one_line(exc: BaseException | str, limit: int = 300) -> str:
    """An exception's or a message's text on one line (pyarrow's span several), cut to ``limit`` chars."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def os_reason(exc: OSError) -> str:
    """What went wrong, without the path: "No space left on device", "Permission denied", ..."""
    text = one_line(exc.strerror or exc)
    # pyarrow puts the whole message in strerror: "Failed to open local file '...'. Detail: [errno 13] ..."
    return text.rsplit("] ", 1)[-1] if "Detail: [errno" in text else text


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Report an OSError while writing ``path`` (disk full, read-only folder, ...) as one UserError line
    naming ``path``: the low-level error may only name a temporary file, or no file at all."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"cannot write {path}: {os_reason(exc)}") from exc


@contextmanager
def replacing(path: Path | str) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write, renamed onto ``path`` when the block ends. A
    write the storage refuses part-way (disk full, file-size limit: a UserError naming ``path``, `writing`)
    leaves the earlier file whole and no temporary file: writing in place would have truncated it first."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with writing(path):
        try:
            yield tmp
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def replace_text(path: Path | str, text: str) -> None:
    """``text`` as the file ``path`` through `replacing`: no half-written file is left, and an earlier one
    survives a failed write (disk full, folder not writable: a UserError naming ``path``)."""
    with replacing(path) as tmp:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)


def write_json(data: dict, path: Path) -> None:
    """``data`` as indented JSON (`replace_text`)."""
    replace_text(path, json.dumps(data, indent=2) + "\n")


def write_versioned(record: object, format: str, path: Path) -> None:
    """``record`` (a dataclass) as indented JSON led by its ``format``, for `read_versioned` to check."""
    write_json({"format": format, **asdict(record)}, path)


def read_versioned(path: Path, readable: tuple, missing: str) -> dict:
    """The JSON record at ``path`` with its format checked (`stored_format`), for its own type to read;
    UserError ``missing`` where there is no such file."""
    if not path.is_file():
        raise UserError(missing)
    stored = json.loads(path.read_text())
    stored_format(stored, readable, path)
    return stored


def stored_format(data: dict, readable: tuple, path: Path) -> int | str:
    """The format version of a record read from ``path``: its "format" key, 1 for a file written before
    records carried one; UserError when it is none of ``readable`` (a later ggpo-offline wrote it)."""
    version = data.get("format", 1)
    if version not in readable:
        shown = ", ".join(map(str, readable))
        raise UserError(f"{path} has format {version!r}; this ggpo-offline reads format {shown}")
    return version


class JobFailure(UserError):
    """A process of the job died, hung or ran out of time (not bad input): a run can resume past it.
    ``lost_peer``: this process only saw another one stop answering (the cause is elsewhere)."""

    def __init__(self, message: str, lost_peer: bool = False):
        super().__init__(message)
        self.lost_peer = lost_peer


def how_it_ended(exitcode: int | None) -> str:
    """A finished process's end in words: "was killed by signal 9 (SIGKILL)" or "exited with code 1"."""
    import signal

    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return f"was killed by signal {-exitcode}"
        return f"was killed by signal {-exitcode} ({name})"
    return f"exited with code {exitcode}"
