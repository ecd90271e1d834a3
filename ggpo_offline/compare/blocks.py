"""What a report is made of: prose, tables whose cells keep their numbers with the formats that write them,
command blocks and figures, grouped in named sections; each written as markdown one way."""

from dataclasses import dataclass

from ggpo_offline.core import markdown


@dataclass(frozen=True)
class Number:
    """A cell's numbers with the format that writes them (``format.format(*values)``): ``"{:.2f}"`` of 52.5
    is "52.50"; the values are kept whole, so the data says more than the text shows."""

    format: str
    values: tuple

    def text(self) -> str:
        return self.format.format(*self.values)

    def within(self, before: str, after: str = "") -> "Number":
        """The same numbers written between ``before`` and ``after`` (bold, a mark)."""
        return Number(_literal(before) + self.format + _literal(after), self.values)

    def then(self, other: "Number", between: str, after: str = "") -> "Number":
        """This number, ``between``, ``other`` and ``after`` as one cell: "52.50 (+1.20 [...] resolved)"."""
        format = self.format + _literal(between) + other.format + _literal(after)
        return Number(format, (*self.values, *other.values))


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def number(format: str, *values) -> Number:
    return Number(format, values)


Cell = str | Number


@dataclass(frozen=True)
class Table:
    """A table: column names (None: a table without, `markdown.table`), rows of cells, one alignment letter
    per column."""

    header: tuple[str, ...] | None
    rows: tuple[tuple[Cell, ...], ...]
    align: str = ""

    def lines(self) -> list[str]:
        rows = [[cell.text() if isinstance(cell, Number) else cell for cell in row] for row in self.rows]
        return markdown.table(self.header, rows, self.align)


@dataclass(frozen=True)
class Prose:
    """Text that explains: markdown lines as written (a paragraph, a list, a subheading)."""

    text: tuple[str, ...]

    def lines(self) -> list[str]:
        return list(self.text)


@dataclass(frozen=True)
class Code:
    """A command block: its language and lines."""

    language: str
    text: tuple[str, ...]

    def lines(self) -> list[str]:
        return [f"```{self.language}", *self.text, "```"]


@dataclass(frozen=True)
class Figure:
    """A figure: its file, beside the README, and the words that say what it shows."""

    path: str
    alt: str

    def lines(self) -> list[str]:
        return [f"![{self.alt}]({self.path})"]


Block = Table | Prose | Code | Figure


def prose(*lines: str) -> Prose:
    return Prose(lines)


@dataclass(frozen=True)
class Section:
    """A named part of a README: a heading (none for an untitled block) and its blocks."""

    name: str
    heading: str
    blocks: tuple[Block, ...]

    def markdown(self) -> list[str]:
        """The heading and a blank line (none untitled), then the blocks, each followed by a blank line."""
        body = [line for block in self.blocks for line in [*block.lines(), ""]]
        return [self.heading, "", *body] if self.heading else body


def block_data(block: Block) -> dict:
    """A block as report.json holds it."""
    if isinstance(block, Table):
        rows = [[_cell_data(cell) for cell in row] for row in block.rows]
        header = None if block.header is None else list(block.header)
        return {"table": {"header": header, "align": block.align, "rows": rows}}
    if isinstance(block, Code):
        return {"code": block.language, "lines": list(block.text)}
    if isinstance(block, Figure):
        return {"figure": block.path, "alt": block.alt}
    return {"prose": list(block.text)}


def _cell_data(cell: Cell) -> str | dict:
    return {"format": cell.format, "values": list(cell.values)} if isinstance(cell, Number) else cell


def block(data: dict) -> Block:
    """A block from report.json (`block_data`)."""
    if "table" in data:
        table = data["table"]
        rows = tuple(tuple(_cell(cell) for cell in row) for row in table["rows"])
        header = None if table["header"] is None else tuple(table["header"])
        return Table(header, rows, table["align"])
    if "code" in data:
        return Code(data["code"], tuple(data["lines"]))
    if "figure" in data:
        return Figure(data["figure"], data["alt"])
    return Prose(tuple(data["prose"]))


def _cell(data: str | dict) -> Cell:
    return data if isinstance(data, str) else Number(data["format"], tuple(data["values"]))


def markdown_text(blocks: list[Block]) -> str:
    """A file of blocks (table.md, styles.md, ablations.md): each set off by a blank line, a newline last."""
    return "\n".join(Section("", "", tuple(blocks)).markdown())
