"""The one exception type for bad user input or environment, and helpers that keep its message one line."""

from collections.abc import Iterator
from contextlib import contextmanager
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
