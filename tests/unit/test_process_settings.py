"""ProcessSettings (configs/default.yaml), its gc_freeze part: while a fit trains, what was alive at its start is out
of the collector's reach, garbage made during setup is collected first, and after the fit the process's collector is
as before. Its heap_reuse part: tests/unit/test_heap_reuse.py."""

import gc
import weakref

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from callbacks import ProcessSettings


class Leftover:
    """A reference cycle: only a collection frees it."""

    def __init__(self) -> None:
        self.me = self


class Watch(Callback):
    """Records, at the first training batch, the frozen count and whether setup's garbage is gone."""

    def __init__(self) -> None:
        self.seen = {}

    def setup(self, trainer, pl_module, stage):
        cycle = Leftover()
        self.garbage = weakref.ref(cycle)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.setdefault("frozen", gc.get_freeze_count())
        self.seen.setdefault("garbage freed", self.garbage() is None)


def fit(*callbacks) -> Watch:
    watch = Watch()
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, callbacks=[*callbacks, watch])
    gc.disable()  # no collection of the test's own making between setup and the first batch
    try:
        trainer.fit(BoringModel())
    finally:
        gc.enable()
    return watch


def test_a_fit_trains_with_its_start_frozen_and_setups_garbage_collected_then_gives_the_collector_back():
    assert gc.get_freeze_count() == 0
    seen = fit(ProcessSettings(heap_reuse=False)).seen
    assert seen["frozen"] > 10_000 and seen["garbage freed"], seen  # torch and Lightning alone are over 100,000
    assert gc.get_freeze_count() == 0
    assert fit().seen == {"frozen": 0, "garbage freed": False}  # without it: nothing frozen, the cycle still there
    assert fit(ProcessSettings(gc_freeze=False, heap_reuse=False)).seen["frozen"] == 0  # its key turns it off
