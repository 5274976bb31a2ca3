"""The Markdown the benchmarks and experiments print: tables, and a median (range) cell for repeated measurements."""

import statistics
from typing import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Header, ``|---|`` rule and rows, one line each; an empty cell is ``| |``."""
    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {cell} " if cell != "" else " " for cell in cells) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


def median_range(values: Sequence[float], spec: str = ".0f") -> str:
    """``1234 (1200-1300)``: the median of repeated measurements and their range."""
    return f"{statistics.median(values):{spec}} ({min(values):{spec}}-{max(values):{spec}})"
