"""The clocks the step-time breakdown (callbacks/step_time.py) reads. A clock makes a mark now and reads it later,
once ``ready``: on CPU ranks the host's monotonic clock (read at once; shared by every process on a host), on CUDA
ranks an event on the GPU's own timeline (read a step or more later, so the host never waits for the device)."""

import time
from typing import Callable, Optional

import torch


class HostClock:
    """The host's monotonic clock: the device is the host, so a mark is its time, ready at once."""

    shared_by_ranks = True  # one host: the ranks' marks compare, so wait is exact

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now()

    def start_epoch(self) -> None:
        """Marks are absolute seconds: no origin to set."""

    def ready(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        """Only at an epoch's end, where the figures synchronise the device anyway."""

    def seconds(self, mark: float) -> float:
        return mark


class CudaEvents:
    """Marks on the GPU's timeline: a timing CUDA event recorded on the current stream (where the step's kernels and
    DDP's wait for its all-reduce are queued). A mark is read, in seconds from the epoch's first event, only once
    ``query()`` says the GPU has passed it (a non-blocking poll); the epoch's last marks are read after ``wait``, at
    the epoch's end, where the epoch's figures synchronise the device anyway. Each GPU's timeline is its own: the ranks' marks do
    not compare, so wait is estimated (callbacks/step_time.py, ``split_wait``)."""

    shared_by_ranks = False

    def __init__(self) -> None:
        self._origin: Optional[torch.cuda.Event] = None

    def __call__(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start_epoch(self) -> None:
        self._origin = self()

    def ready(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def wait(self, mark: torch.cuda.Event) -> None:
        mark.synchronize()

    def seconds(self, mark: torch.cuda.Event) -> float:
        return self._origin.elapsed_time(mark) / 1000.0
