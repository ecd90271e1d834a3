"""Markdown tables, written the one way every report, card and README of the project writes them."""

from collections.abc import Iterable, Sequence

SEPARATORS = {"l": "---", "r": "---:"}
"""A column's separator cell by its alignment letter: left (GitHub's default) or right."""


def table(header: Sequence[object] | None, rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """The lines of a GitHub pipe table: header, separator, then one line per row.

    Each cell is set off by one space on each side (``| a | b |``) and never padded to a column's width, so
    that a diff of two reports shows only the cells that changed. ``align`` gives one letter per column,
    ``l`` (``---``) or ``r`` (``---:``); empty, every column is ``l``. ``header`` None: a table without
    column names, whose header line (GitHub needs one) is blank, ``| | |``. A ``|`` inside a cell is
    written ``\\|``, which GitHub shows as ``|`` (in code spans too) instead of starting another column.
    """
    columns = len(align or header or ())
    align = align or "l" * columns
    if set(align) - set(SEPARATORS):
        raise ValueError(f"alignments are l or r, one per column: {align!r}")
    if header is not None and len(header) != columns:
        raise ValueError(f"{len(header)} column names for {columns} alignments ({align!r})")
    lines = ["|" + " |" * columns if header is None else _line(header, columns)]
    lines.append("|" + "".join(SEPARATORS[letter] + "|" for letter in align))
    return lines + [_line(row, columns) for row in rows]


def _line(cells: Sequence[object], columns: int) -> str:
    if len(cells) != columns:
        raise ValueError(f"a row of {len(cells)} cells in a table of {columns} columns: {cells!r}")
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"
