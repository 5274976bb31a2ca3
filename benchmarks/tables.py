"""What the benchmarks and experiments write: Markdown tables, median (range) cells, CSV files, figures."""

import csv
import statistics
from pathlib import Path
from typing import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Header, ``|---|`` rule and rows, one line each; an empty cell is ``| |``."""
    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {cell} " if cell != "" else " " for cell in cells) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


def median_range(values: Sequence[float], spec: str = ".0f", dash: str = "-", note: str = "") -> str:
    """``1234 (1200-1300)``: the median of repeated measurements and their range (``note`` inside the brackets)."""
    return f"{statistics.median(values):{spec}} ({min(values):{spec}}{dash}{max(values):{spec}}{note})"


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def figure(ncols: int = 2, width: float = 12.0, height: float = 4.5):
    """A matplotlib Figure and its ``ncols`` axes, without pyplot (no display, no global state: the Agg canvas)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
