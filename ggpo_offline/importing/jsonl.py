"""Read JSON lines one at a time, naming the file and line of a record that is not JSON."""

import json
from collections.abc import Iterator
from pathlib import Path

from ggpo_offline.core.errors import UserError, one_line


def json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, record)`` for every non-blank line of ``path`` (1-based); UserError naming the line
    of a record that is not a JSON object, and saying so when it is the file's unfinished last line."""
    with open(path, "rb") as handle:
        number = 0
        for number, raw in enumerate(handle, start=1):  # noqa: B007 - the count is read after the loop too
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)  # NaN and Infinity are read (NeMo-RL writes them): checked later
            except (ValueError, RecursionError) as error:
                truncated = not raw.endswith(b"\n")
                what = "the file ends inside this record (truncated)" if truncated else one_line(error)
                raise UserError(f"{path}:{number}: not a JSON record ({what})") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{number}: a JSON {type(record).__name__}, expected an object")
            yield number, record
