"""The printed epoch line read back, for the tests that pin what a user sees (tools read metrics.csv instead)."""

import re
from typing import List, Optional

from callbacks.run_record import EpochRecord

# The workshop's fields, then MFU where the device's peak is known (appended: the fields before it are unchanged).
EPOCH_LINE = re.compile(r"^Epoch (\d+): Cumulative Time = ([\d.]+), Images/sec = ([\d.]+), "
                        r"Val Loss = ([\d.]+|nan|n/a), Val Acc = ([\d.]+|nan|n/a)(?:, MFU = ([\d.]+) %)?$",
                        re.MULTILINE)


def parse_epoch_lines(text: str) -> List[EpochRecord]:
    """Every epoch line in ``text`` (a run's stdout), in order; ``n/a`` reads as None. Its MFU: :func:`epoch_mfus`."""

    def num(value: str) -> Optional[float]:
        return None if value == "n/a" else float(value)

    return [EpochRecord(int(m[1]), float(m[2]), float(m[3]), num(m[4]), num(m[5])) for m in EPOCH_LINE.finditer(text)]


def epoch_mfus(text: str) -> List[Optional[float]]:
    """The MFU at the end of every epoch line in ``text``, as a fraction (None where a line has none)."""
    return [None if m[6] is None else float(m[6]) / 100 for m in EPOCH_LINE.finditer(text)]
