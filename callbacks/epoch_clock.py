"""One rank's training time per epoch with validation left out (EpochClock), and the epoch's figures over all
ranks (combine_ranks): the plain arithmetic callbacks/throughput.py's ThroughputReport calls."""

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

@dataclass
class EpochTiming:
    """One rank's training epoch: images seen and seconds spent (validation excluded)."""

    images: int = 0
    seconds: float = 0.0
    data_wait_s: float = 0.0  # host time between the end of one step and the start of the next
    compute_s: float = 0.0  # host time inside the step (forward, backward, optimizer)


class EpochClock:
    """Times one rank's training epochs; pausable so validation does not count. Clock injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.timing = EpochTiming()
        self._epoch_start: Optional[float] = None
        self._paused_at: Optional[float] = None
        self._paused_s = 0.0
        self._last_mark: Optional[float] = None
        self._batch_start: Optional[float] = None

    def start_epoch(self) -> None:
        self.timing = EpochTiming()
        self._epoch_start = self._last_mark = self.clock()
        self._paused_s, self._paused_at = 0.0, None

    def start_batch(self) -> None:
        if self._last_mark is None:
            self.start_epoch()  # resumed mid-epoch: Lightning does not call on_train_epoch_start again
        now = self.clock()
        self.timing.data_wait_s += now - self._last_mark
        self._batch_start = now

    def end_batch(self, images: int) -> float:
        """Count the batch; returns its host time (start of the step to its end)."""
        now = self.clock()
        step_s = now - self._batch_start
        self.timing.compute_s += step_s
        self.timing.images += images
        self._last_mark = now
        return step_s

    def trained_s(self) -> float:
        """The epoch's training seconds up to the last batch's end."""
        return self._last_mark - self._epoch_start - self._paused_s

    def pause(self) -> None:
        if self._epoch_start is not None and self._paused_at is None:
            self._paused_at = self.clock()

    def resume(self) -> None:
        if self._paused_at is not None:
            now = self.clock()
            self._paused_s += now - self._paused_at
            self._last_mark = now  # time in validation is not data-wait either
            self._paused_at = None

    def end_epoch(self) -> EpochTiming:
        if self._epoch_start is None:  # resumed after the epoch's last batch: nothing of it was trained here
            self.start_epoch()
        now = self._paused_at if self._paused_at is not None else self.clock()
        self.timing.seconds = now - self._epoch_start - self._paused_s
        self._epoch_start = None
        return self.timing


def combine_ranks(timings: List[EpochTiming], devices_per_rank: int = 1, cumulative_s: float = 0.0) -> Dict[str, float]:
    """The epoch's columns of the record: all ranks' images over the slowest rank's time, which adds to
    ``cumulative_s`` (the training time before this epoch); data-wait and compute are rank means. ``devices_per_rank``:
    GPUs one process drives (dp); the per-device rate divides by every device."""
    n = len(timings)
    seconds = max(t.seconds for t in timings)
    rate = sum(t.images for t in timings) / seconds if seconds > 0 else 0.0
    return {"throughput/images_per_sec": rate,
            "throughput/images_per_sec_per_device": rate / (n * devices_per_rank),
            "time/epoch_s": seconds,
            "time/cumulative_s": cumulative_s + seconds,
            "time/data_wait_s": sum(t.data_wait_s for t in timings) / n,
            "time/compute_s": sum(t.compute_s for t in timings) / n}
