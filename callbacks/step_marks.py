"""Taking the step-time breakdown's marks (the arithmetic over them: callbacks/step_time.py). A clock makes a mark
now and reads it later, once ``ready``: on CPU ranks the host's monotonic clock (read at once; shared by every
process on a host), on CUDA ranks an event on the GPU's own timeline (read a step or more later, so the host never
waits for the device). The timer takes its marks at Lightning's hooks, in a DDP communication hook wrapping the
run's own, and around FSDP2's all-gathers and reduce-scatters."""

import time
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from callbacks.step_time import RankEpoch, StepMarks, summarise


class HostClock:
    """The host's monotonic clock: the device is the host, so a mark is its time, ready at once (read at the epoch's
    end, not polled per step)."""

    shared_by_ranks = True  # one host: the ranks' marks compare, so wait is exact
    polled = False  # its marks need no per-step poll: they are read when the epoch's figures are made
    pooled = False  # a mark is a number: never released, and one can serve two batches (an end, the next one's data)

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now()

    def start_epoch(self) -> None:
        """Marks are absolute seconds: no origin to set."""

    def ready(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        """Nothing to wait for: a host mark is ready when made."""

    def seconds(self, mark: float) -> float:
        return mark


class CudaEvents:
    """Marks on the GPU's timeline: a timing CUDA event recorded on the current stream (where the step's kernels and
    DDP's wait for its all-reduce are queued). A mark is read, in seconds from the epoch's first event, only once
    ``query()`` says the GPU has passed it (a non-blocking poll); the epoch's last marks are read after ``wait``, at
    the epoch's end, where the epoch's figures synchronise the device anyway. Events are made once and reused
    (``release``): creating one per mark is host time on every timed step. Each GPU's timeline is its own: the
    ranks' marks do not compare, so wait is estimated (callbacks/step_time.py, ``split_wait``)."""

    shared_by_ranks = False
    polled = True
    pooled = True  # a mark is an event that goes back to the pool once read: each has one owner

    def __init__(self) -> None:
        self._origin: Optional[torch.cuda.Event] = None
        self._free: List[torch.cuda.Event] = []

    def __call__(self) -> torch.cuda.Event:
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start_epoch(self) -> None:
        if self._origin is not None:
            self.release(self._origin)
        self._origin = self()

    def ready(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def wait(self, mark: torch.cuda.Event) -> None:
        mark.synchronize()

    def seconds(self, mark: torch.cuda.Event) -> float:
        return self._origin.elapsed_time(mark) / 1000.0

    def release(self, mark: torch.cuda.Event) -> None:
        self._free.append(mark)


def _marks_of(batch: dict) -> list:
    return [*batch["at"].values(), *(mark for span in batch["collectives"] for mark in span)]


class StepTimer:
    """One rank's marks, from Lightning's hooks (ThroughputReport calls them) and :meth:`wrap`'s comm hook, on
    a clock above, read once it is past them: on a GPU a step or more later. ``sample_every`` n: only every n-th
    batch of an epoch is timed (its marks, and the end of the batch before it for its data time); the others cost one
    counter. Every batch on CPU ranks, where a mark is free; on GPUs, where each mark is an event recorded and
    polled, the figures are the timed batches' scaled to all of them (:meth:`take_epoch`)."""

    def __init__(self, clock: HostClock, sample_every: int = 1) -> None:
        self.clock = clock
        self.sample_every = sample_every
        self.paused = False  # no batch timed while set (benchmarks/breakdown_windows.py: its cost in one process)
        self.marks: List[StepMarks] = []
        self.batches = 0  # in this epoch, timed or not
        self._pending: List[dict] = []  # batches ended, their marks not read yet, oldest first
        self._last_end = None
        self._current: Optional[dict] = None

    def start_epoch(self) -> None:
        self.clock.start_epoch()
        self.marks, self._pending, self._current, self.batches = [], [], None, 0
        self._last_end = self.clock()

    def restart_data_time(self) -> None:
        """A new start for the next timed batch's data time (after validation: its time is no data wait); the mark it
        replaces is no batch's (``batch_end``)."""
        if self._last_end is not None and self.clock.pooled:
            self.clock.release(self._last_end)
        self._last_end = self.clock()

    def batch_start(self, window: int = 0) -> None:
        if self._last_end is None:  # resumed mid-epoch: Lightning does not call on_train_epoch_start again
            self.start_epoch()
        if self.clock.polled:
            self._read()
        self.batches += 1
        if (self.batches - 1) % self.sample_every or self.paused:
            return  # not timed
        self._current = {"at": {"previous_end": self._last_end, "start": self.clock()}, "window": window,
                         "buckets": 0, "gradient_bytes": 0, "collectives": []}

    def _mark(self, name: str) -> None:
        if self._current is not None:
            self._current["at"][name] = self.clock()

    def before_backward(self) -> None:
        self._mark("before_backward")

    def after_backward(self) -> None:
        self._mark("after_backward")

    def before_optimizer(self) -> None:
        self._mark("before_optimizer")

    def batch_end(self) -> None:
        if self._current is not None:
            self._mark("end")
            # the next timed batch's data time starts here: its own mark where marks are pooled (one owner each)
            self._last_end = self.clock() if self.clock.pooled else self._current["at"]["end"]
            self._pending.append(self._current)
            self._current = None
        elif self.batches % self.sample_every == 0 and not self.paused:  # the next batch is timed: data from here
            self.restart_data_time()

    def _read(self) -> None:
        """The pending batches the clock is past, as StepMarks in seconds, oldest first (it passes them in order);
        their marks go back to the clock."""
        while self._pending and all(map(self.clock.ready, _marks_of(self._pending[0]))):
            batch, read = self._pending.pop(0), self.clock.seconds
            marks = _marks_of(batch)
            at = {name: read(mark) for name, mark in batch.pop("at").items()}
            batch["collectives"] = [(read(start), read(end)) for start, end in batch["collectives"]]
            previous_end = at.pop("previous_end")
            self.marks.append(StepMarks(data_s=at["start"] - previous_end, **at, **batch))
            if self.clock.pooled:
                for mark in {id(mark): mark for mark in marks}.values():  # first_launch may be arrival too
                    self.clock.release(mark)

    def take_epoch(self) -> RankEpoch:
        """The epoch's summary, read to its last mark (at the epoch's end only); its batches' marks stay in ``marks``
        until the next epoch starts. Sampled: every part scaled from the timed batches to all of them."""
        if self._pending:
            self.clock.wait(self._pending[-1]["at"]["end"])
        self._read()
        epoch = summarise(self.marks)
        timed = len(self.marks)
        if self.sample_every > 1 and timed:
            epoch.parts = {part: seconds * self.batches / timed for part, seconds in epoch.parts.items()}
            epoch.overlapped_s *= self.batches / timed
        return epoch

    def wrap(self, hook: Callable) -> Callable:
        """A DDP communication hook that runs ``hook`` and marks when each bucket reached it on timed batches; the
        future it returns is ``hook``'s own."""

        def timed(state, bucket):
            current = self._current
            if current is not None:
                now = self.clock()
                at = current["at"]
                at.setdefault("first_launch", now)
                if "arrival" in at and at["arrival"] is not at["first_launch"] and self.clock.pooled:
                    self.clock.release(at["arrival"])  # a later bucket's replaces it
                at["arrival"] = now
                current["buckets"] += 1
                current["gradient_bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
            return hook(state, bucket)

        return timed

    def collective(self, run: Callable, *args, **kwargs):
        """``run(*args, **kwargs)``, its span marked on timed batches."""
        if self._current is None:
            return run(*args, **kwargs)
        start = self.clock()
        work = run(*args, **kwargs)
        self._current["collectives"].append((start, self.clock()))
        return work


class TimedAllGather:
    """FSDP2's all-gather as ``FSDPModule.set_custom_all_gather`` takes it, run by torch.distributed's public
    collective as FSDP2's default does, its span marked. Host clock only: there (gloo) a collective returns when done,
    so the span is its comm and wait together (FSDP2 offers no hook to split them)."""

    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        return self.timer.collective(dist.all_gather_into_tensor, output_tensor, input_tensor, group=group,
                                     async_op=async_op)


class TimedReduceScatter(TimedAllGather):
    """FSDP2's reduce-scatter (``FSDPModule.set_custom_reduce_scatter``), the same way."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        return self.timer.collective(dist.reduce_scatter_tensor, output_tensor, input_tensor, op=op, group=group,
                                     async_op=async_op)


def time_collectives(timer: StepTimer, strategy, module) -> str:
    """Time the gradients' collectives before the first backward: DDP's all-reduce (its hook wrapped, registered by
    ``DistributedDataParallel.register_comm_hook``), or on CPU ranks fsdp's all-gathers and reduce-scatters (FSDP2's
    ``set_custom_all_gather``, torch >= 2.8; on CUDA they run on streams of their own). What the start block says."""
    if isinstance(strategy.model, DistributedDataParallel):
        try:
            strategy.model.register_comm_hook(None, timer.wrap(default_hooks.allreduce_hook))  # read now: tests slow it
        except RuntimeError:  # "can only be registered once"
            return "DDP's all-reduce untimed (a comm hook of your own: DDP takes one)"
        return "times DDP's all-reduce (its comm hook)"
    shards = [part for part in module.modules() if isinstance(part, FSDPModule)]
    if not shards:
        return ""
    if strategy.root_device.type != "cpu" or not hasattr(FSDPModule, "set_custom_all_gather"):
        return "fsdp's collectives untimed (in forward and backward): timed on CPU ranks with torch >= 2.8"
    for part in shards:
        part.set_custom_all_gather(TimedAllGather(timer))
        part.set_custom_reduce_scatter(TimedReduceScatter(timer))
    return "times fsdp's all-gathers and reduce-scatters"
