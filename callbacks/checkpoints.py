"""Lightning's ModelCheckpoint, cheaper at every step: its state key made once (Lightning formats every callback's
state key at every hook it calls, the profiler's label, and ModelCheckpoint's is a repr of its settings: for the two
of a default run, twelve a step), and its batch-end hook skipped when it saves only at epochs. The key is the same
string, so checkpoints written by either class load in both."""

from functools import cached_property

from lightning.pytorch import callbacks

from fashion_mnist_dp.runtime import compat


class ModelCheckpoint(callbacks.ModelCheckpoint):
    """:class:`lightning.pytorch.callbacks.ModelCheckpoint`, whose settings never change after ``__init__``."""

    @cached_property
    def state_key(self) -> str:
        return super().state_key

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs) -> None:
        if compat.saves_on_train_steps(self):
            super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
