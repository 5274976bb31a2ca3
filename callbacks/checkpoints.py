"""Lightning's ModelCheckpoint with its state key made once. Lightning formats every callback's state key at every
hook it calls (the profiler's label), and ModelCheckpoint's is a repr of its settings: for the two of a default run,
twelve a step. The key is the same string, so checkpoints written by either class load in both."""

from lightning.pytorch import callbacks


class ModelCheckpoint(callbacks.ModelCheckpoint):
    """:class:`lightning.pytorch.callbacks.ModelCheckpoint`, whose settings in the key never change after ``__init__``."""

    @property
    def state_key(self) -> str:
        key = self.__dict__.get("_state_key")
        if key is None:
            key = self.__dict__["_state_key"] = super().state_key
        return key
