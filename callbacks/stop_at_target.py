"""Stop training once validation accuracy has reached a target for ``patience`` consecutive epochs (the DLI course's
rule). Lightning's ``EarlyStopping`` cannot express this: its ``stopping_threshold`` stops at the first epoch that
reaches the threshold, and its ``patience`` counts epochs *without improvement*, not epochs at or above a target."""

from typing import Optional

from jsonargparse.typing import ClosedUnitInterval, PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.throughput import ThroughputReport


class StopAtTarget(Callback):
    """Stops after ``patience`` consecutive validated epochs with ``monitor`` >= ``target_accuracy``; rank 0 prints
    one line. Epochs without validation neither count nor break the streak; the streak is checkpointed.

    Args:
        target_accuracy: Validation accuracy to reach, e.g. 0.85; ``None``: never stop early.
        patience: Consecutive epochs at or above the target before stopping.
        monitor: The logged metric compared with the target."""

    def __init__(self, target_accuracy: Optional[ClosedUnitInterval] = None, patience: PositiveInt = 2,
                 monitor: str = "val/acc") -> None:
        self.target_accuracy = target_accuracy
        self.patience = patience
        self.monitor = monitor
        self.streak = 0  # consecutive validated epochs at or above the target
        self._validated = False
        self._report: Optional[ThroughputReport] = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self.target_accuracy is not None:
            self._report = ThroughputReport.of(trainer, self)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        validated, self._validated = self._validated, False
        accuracy = trainer.callback_metrics.get(self.monitor)
        if self.target_accuracy is None or not validated or accuracy is None:
            return
        accuracy = float(accuracy)
        self.streak = self.streak + 1 if accuracy >= self.target_accuracy else 0
        # val/acc is already synced over ranks (torchmetrics), so every rank takes the same decision;
        # reduce it anyway, as EarlyStopping does, so that no rank can stop alone.
        if not trainer.strategy.reduce_boolean_decision(self.streak >= self.patience, all=False):
            return
        trainer.should_stop = True
        if trainer.is_global_zero:
            print(f"Target reached: val/acc >= {self.target_accuracy:g} for {self.patience} consecutive epoch(s); "
                  f"stopping after epoch {trainer.current_epoch + 1} (Val Acc = {accuracy:.3f}, Cumulative Time = "
                  f"{self._report.cumulative_s:.3f})", flush=True)

    def state_dict(self) -> dict:
        return {"streak": self.streak}

    def load_state_dict(self, state_dict: dict) -> None:
        self.streak = state_dict.get("streak", 0)
