"""The host-time settings a run makes, in one place: the process-wide ones each undone at teardown (the start block's
``process`` line says which): Python's full garbage collections kept out of the training steps, and freed memory kept
in the heap for the next step (docs/benchmarks.md, "Garbage collection" and "Freed memory kept"); and the trainer's
profiler when none is asked for."""

import contextlib
import ctypes
import gc
import platform

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.profilers import PassThroughProfiler

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_CEILING = 32 * 1024 * 1024  # the largest mmap threshold glibc takes on 64-bit: larger blocks are mapped anyway
KEEP_TOP = 1024 ** 3  # the heap's free top kept up to this size while training


class ProcessSettings(Callback):
    """``gc_freeze``: at train start one collection, then every object alive (a run's ~450,000) moved out of the
    collector's reach (``gc.freeze``): a full collection took 0.2 s inside one rank's step at a time, and the other
    ranks waited. ``heap_reuse``: from setup to teardown, freed blocks up to 32 MiB stay in glibc's heap and its top
    is not trimmed (``mallopt``): a CPU step faulted its activations' pages in again, up to 27 ms of kernel time;
    at teardown the heap's free memory goes back to the kernel. Nothing where the C library is not glibc."""

    def __init__(self, gc_freeze: bool = True, heap_reuse: bool = True) -> None:
        self.gc_freeze = gc_freeze
        libc = ctypes.CDLL(None) if heap_reuse and platform.libc_ver()[0] == "glibc" else None
        self.mallopt, self.malloc_trim = (libc.mallopt, libc.malloc_trim) if libc else (None, None)

    def start_lines(self, trainer: Trainer) -> list:
        """The start block's line."""
        made = [name for name, on in (("gc.freeze at train start", self.gc_freeze),
                                      ("glibc's mallopt keeps freed blocks up to 32 MiB", self.mallopt)) if on]
        return [f"  process         : {'; '.join(made) or 'as Python and the C library have it'} (callbacks.process)"]

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.mallopt:
            self.mallopt(M_MMAP_THRESHOLD, MMAP_CEILING)
            self.mallopt(M_TRIM_THRESHOLD, KEEP_TOP)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.gc_freeze:
            gc.collect()
            gc.freeze()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.gc_freeze:
            gc.unfreeze()
        if self.mallopt:
            self.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_CEILING)  # glibc's own adjustment after such blocks
            self.malloc_trim(0)


class NullProfiler(PassThroughProfiler):
    """Lightning's profiler when none is chosen (``PassThroughProfiler``), its ``profile`` one shared null context
    instead of a new generator: Lightning enters it around every hook of every callback, about 100 times a step
    (docs/benchmarks.md, "Host time per step"). ``--trainer.profiler simple`` (or any other) replaces it."""

    _NOTHING = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext:
        return self._NOTHING
