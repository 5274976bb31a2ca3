"""Python's full garbage collections out of the training steps: with a run's ~450,000 objects alive at train start,
each took 0.2 s, inside one rank's step at a time, so the other ranks waited for it (docs/benchmarks.md, "Garbage
collection")."""

import gc

from lightning.pytorch import Callback, LightningModule, Trainer


class GcFreeze(Callback):
    """At train start, one collection, then every object alive is moved out of the collector's reach
    (``gc.freeze``): later full collections scan only what training made. Given back at teardown."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        gc.collect()
        gc.freeze()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        gc.unfreeze()
