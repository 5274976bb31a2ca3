"""Lightning's ModelCheckpoint with its state key made once: Lightning formats every callback's state key at every
hook it calls (the profiler's label), and ModelCheckpoint's is a repr of its settings. The key is the same string,
so checkpoints written by either class load in both."""

from functools import cached_property

from lightning.pytorch import callbacks


class ModelCheckpoint(callbacks.ModelCheckpoint):
    """:class:`lightning.pytorch.callbacks.ModelCheckpoint`, whose settings never change after ``__init__``."""

    @cached_property
    def state_key(self) -> str:
        return super().state_key
