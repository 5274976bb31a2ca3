"""Progress inside an epoch: Lightning's TQDM bar showing batches done, the training loss and images/sec from values
already on the host, so it never makes a step wait for the device (Lightning's own bar reads its metrics from the
device at every refresh). Shown when stdout is a terminal unless ``--progress`` says otherwise."""

import sys
import time
from typing import Dict, Optional

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar

from callbacks.owner import each


class ProgressBar(TQDMProgressBar):
    """``show_progress``: None shows the bar when stdout is a terminal (train.py's ``--progress`` sets it)."""

    def __init__(self, show_progress: Optional[bool] = None, refresh_rate: int = 1) -> None:
        super().__init__(refresh_rate=refresh_rate)
        if not (sys.stdout.isatty() if show_progress is None else show_progress):
            self.disable()

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> Dict[str, str]:
        """The mean training loss of the last decision point (fashion_mnist_dp/runtime/agreement.py) and this rank's
        images/sec since the epoch began × the world size (the epoch line has the measured figure)."""
        shown = {}
        loss = next((c.latest for c in each(trainer.callbacks) if type(c).__name__ == "TrainingLoss"), None)
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
        if self.is_enabled:
            self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}")  # as the epoch line counts
