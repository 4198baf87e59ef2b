"""Plain aligned columns, as kubectl prints them: no box drawing, no colour, no wrapping, so
that the output reads the same on a terminal, in a pipe and in a log."""

from __future__ import annotations

from collections.abc import Sequence

GAP = "   "  # kubectl's column separator


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``headers`` and ``rows`` left-aligned in columns; the last column is not padded."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append(GAP.join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)
