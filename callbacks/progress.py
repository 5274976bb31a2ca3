"""Progress inside an epoch: Lightning's progress bar (Rich when installed, else TQDM) showing batches done, the
training loss and images/sec from values already on the host, so it never makes a step wait for the device
(Lightning's own bar reads its metrics from the device at every refresh). On by default when stdout is a terminal."""

import importlib.util
import time
from typing import Dict

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class HostMetrics:
    """``get_metrics`` of both bars: the mean training loss of the last decision point (fashion_mnist_dp/runtime/agreement.py) and
    this rank's images/sec since the epoch began × the world size (the epoch line has the measured figure)."""

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> Dict[str, str]:
        shown = {}
        loss = next((c.latest for c in trainer.callbacks if type(c).__name__ == "TrainingLoss"), None)
        if loss is not None:
            shown["loss"] = f"{loss:.3f}"
        if trainer.training and getattr(self, "_epoch_started", None):
            done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            images = done * getattr(pl_module.batch_plan, "batch_size_per_process", 0) * trainer.world_size
            shown["img/s"] = f"{images / max(time.perf_counter() - self._epoch_started, 1e-9):.0f}"
        return shown

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_started = time.perf_counter()
        super().on_train_epoch_start(trainer, pl_module)


class TQDMBar(HostMetrics, TQDMProgressBar):
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}")  # as the epoch line counts


class RichBar(HostMetrics, RichProgressBar):
    pass


def progress_bar() -> Callback:
    """Rich's bar when the ``rich`` package is installed, else TQDM's."""
    return RichBar() if importlib.util.find_spec("rich") is not None else TQDMBar()
