"""The one markdown-table writer: its exact lines, alignment, a blank header, escaped pipes, bad shapes."""

import pytest

from ggpo_offline.core import markdown


def test_a_table_is_header_separator_and_rows_each_cell_set_off_by_one_space():
    lines = markdown.table(
        ["method", "update", "mean@8"], [["GRPO", 10, "51.81 ± 1.31 †"], ["GGPO", 20, ""]], "lrr"
    )
    assert lines == [
        "| method | update | mean@8 |",
        "|---|---:|---:|",
        "| GRPO | 10 | 51.81 ± 1.31 † |",
        "| GGPO | 20 |  |",  # an empty cell keeps both spaces, as the committed reports have it
    ]


def test_without_align_every_column_takes_githubs_default():
    assert markdown.table(("a", "b"), [("x", "y")]) == ["| a | b |", "|---|---|", "| x | y |"]
    assert markdown.table(("a",), []) == ["| a |", "|---|"]


def test_a_table_without_column_names_has_a_blank_header_line():
    assert markdown.table(None, [("gap", "23.2 points")], "lr") == [
        "| | |",
        "|---|---:|",
        "| gap | 23.2 points |",
    ]


def test_a_pipe_inside_a_cell_is_escaped_so_it_starts_no_column():
    lines = markdown.table(["setting", "value"], [["answer_rule", "`a|b`"]])
    assert lines[2] == "| answer_rule | `a\\|b` |"


@pytest.mark.parametrize(
    ("header", "rows", "align", "message"),
    [
        (["a", "b"], [["x"]], "", r"a row of 1 cells in a table of 2 columns"),
        (["a", "b"], [], "lrr", r"2 column names for 3 alignments \('lrr'\)"),
        (["a", "b"], [], "lc", r"alignments are l or r, one per column: 'lc'"),
    ],
)
def test_a_row_or_header_of_the_wrong_width_is_refused(header, rows, align, message):
    with pytest.raises(ValueError, match=message):
        markdown.table(header, rows, align)
