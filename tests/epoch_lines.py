"""The printed epoch line read back, for the tests that pin what a user sees (tools read metrics.csv instead)."""

import re
from typing import List, Optional

from callbacks.run_record import EpochRecord

EPOCH_LINE = re.compile(r"^Epoch (\d+): Cumulative Time = ([\d.]+), Images/sec = ([\d.]+), "
                        r"Val Loss = ([\d.]+|nan|n/a), Val Acc = ([\d.]+|nan|n/a)$", re.MULTILINE)


def parse_epoch_lines(text: str) -> List[EpochRecord]:
    """Every epoch line in ``text`` (a run's stdout), in order; ``n/a`` reads as None."""

    def num(value: str) -> Optional[float]:
        return None if value == "n/a" else float(value)

    return [EpochRecord(int(m[1]), float(m[2]), float(m[3]), num(m[4]), num(m[5])) for m in EPOCH_LINE.finditer(text)]
