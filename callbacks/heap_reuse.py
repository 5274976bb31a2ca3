"""Freed memory kept for the next step: glibc's malloc gives a freed block of 128 KiB or more back to the kernel (its
own mapping, or the heap's top trimmed), so each CPU step faulted its activations' pages in again: up to 17,000 page
faults and 27 ms of kernel time a step on torch 2.15 (docs/benchmarks.md, "Freed memory kept")."""

import ctypes
import platform

from lightning.pytorch import Callback, LightningModule, Trainer

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_CEILING = 32 * 1024 * 1024  # the largest mmap threshold glibc takes on 64-bit: larger blocks are mapped anyway
KEEP_TOP = 1024 ** 3  # the heap's free top kept up to this size while training


class HeapReuse(Callback):
    """From setup to teardown, freed blocks up to 32 MiB stay in the heap and its top is not trimmed (``mallopt``,
    glibc's documented switches): the next step reuses them without a page fault. The process keeps its peak size,
    which every step reaches anyway. At teardown the heap's free memory goes back to the kernel, and later its top is
    trimmed above 64 MiB, as glibc's own adjustment leaves it after freeing such blocks. Nothing where the C library
    is not glibc."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None
        self.mallopt, self.malloc_trim = (libc.mallopt, libc.malloc_trim) if libc else (None, None)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.mallopt:
            self.mallopt(M_MMAP_THRESHOLD, MMAP_CEILING)
            self.mallopt(M_TRIM_THRESHOLD, KEEP_TOP)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.mallopt:
            self.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_CEILING)
            self.malloc_trim(0)
