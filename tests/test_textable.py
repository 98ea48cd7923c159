"""The plain-text table formatter."""
from __future__ import annotations

import pytest

from pydtnn_lite.textable import format_table


def test_labels_left_figures_right_columns_as_wide_as_their_widest_cell():
    table = format_table(("kernel", "ms", "GB/s"), [("gemm", "12.50", 3.1), ("im2col", "0.25", "10.0")])
    assert table.split("\n") == [
        "kernel     ms  GB/s",
        "-------------------",
        "gemm    12.50   3.1",
        "im2col   0.25  10.0",
    ]


def test_align_sets_each_column_and_lines_carry_no_trailing_spaces():
    table = format_table(("#", "layer", "details"), [(0, "conv1", "3x3"), (11, "relu1", "")], align="><<")
    assert table.split("\n") == [
        " #  layer  details",
        "------------------",
        " 0  conv1  3x3",
        "11  relu1",
    ]


def test_a_table_without_rows_is_its_header():
    assert format_table(("stage", "ms"), []) == "stage  ms\n---------"


@pytest.mark.parametrize("align, rows", [("<", [("a", "1")]), ("<^", [("a", "1")]), (None, [("a",)])])
def test_refuses_an_alignment_or_a_row_that_does_not_match_the_columns(align, rows):
    with pytest.raises(ValueError):
        format_table(("name", "value"), rows, align=align)
