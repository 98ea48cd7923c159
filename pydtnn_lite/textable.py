"""Plain-text tables: the one formatter every report and benchmark of the package prints with."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

LEFT, RIGHT = "<", ">"
GAP = "  "


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """``rows`` under ``headers`` as aligned columns two spaces apart, a rule of dashes under the header.

    Cells are printed with ``str`` (format numbers before passing them); each column is as
    wide as its widest cell or header. ``align`` holds one character per column, ``<``
    (left) or ``>`` (right); by default the first column, the labels, is left-aligned and
    the others, the figures, right-aligned. Lines carry no trailing spaces.
    """
    align = align or LEFT + RIGHT * (len(headers) - 1)
    if len(align) != len(headers) or set(align) - {LEFT, RIGHT}:
        raise ValueError(f"align needs one of {LEFT!r} or {RIGHT!r} per column ({len(headers)}), got {align!r}")
    cells = [[str(cell) for cell in row] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(f"a row has {len(row)} cells, the table {len(headers)} columns: {row}")
    widths = [max([len(header)] + [len(row[i]) for row in cells]) for i, header in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        return GAP.join(cell.ljust(width) if side == LEFT else cell.rjust(width)
                        for cell, width, side in zip(row, widths, align, strict=True)).rstrip()

    rule = "-" * (sum(widths) + len(GAP) * (len(widths) - 1))
    return "\n".join([line(list(headers)), rule] + [line(row) for row in cells])
