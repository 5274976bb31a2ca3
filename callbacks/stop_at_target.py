"""Stop training once validation accuracy has reached a target for ``patience`` consecutive epochs (the DLI course's rule).

Lightning's ``EarlyStopping`` cannot express this: its ``stopping_threshold`` stops at the
first epoch that reaches the threshold, and its ``patience`` counts epochs *without
improvement*, not epochs at or above a target.
"""

from typing import Optional

from jsonargparse.typing import ClosedUnitInterval, PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.throughput import ThroughputReport


class TargetStreak:
    """Counts consecutive epochs at or above ``target``; ``update`` says whether ``patience`` is reached."""

    def __init__(self, target: float, patience: int) -> None:
        self.target = target
        self.patience = patience
        self.streak = 0

    def update(self, accuracy: float) -> bool:
        self.streak = self.streak + 1 if accuracy >= self.target else 0
        return self.streak >= self.patience


def format_stop_line(epoch: int, accuracy: float, target: float, patience: int, cumulative_s: float) -> str:
    return (
        f"Target reached: val/acc >= {target:g} for {patience} consecutive epoch(s); stopping after epoch {epoch} "
        f"(Val Acc = {accuracy:.3f}, Cumulative Time = {cumulative_s:.3f})"
    )


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
        self.streak = TargetStreak(target_accuracy if target_accuracy is not None else 1.0, patience)
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
        # val/acc is already synced over ranks (torchmetrics), so every rank takes the same decision;
        # reduce it anyway, as EarlyStopping does, so that no rank can stop alone.
        reached = trainer.strategy.reduce_boolean_decision(self.streak.update(float(accuracy)), all=False)
        if not reached:
            return
        trainer.should_stop = True
        if trainer.is_global_zero:
            line = format_stop_line(trainer.current_epoch + 1, float(accuracy), self.target_accuracy, self.patience,
                                    self._report.cumulative_s)
            print(line, flush=True)

    def state_dict(self) -> dict:
        return {"streak": self.streak.streak}

    def load_state_dict(self, state_dict: dict) -> None:
        self.streak.streak = state_dict.get("streak", 0)
