"""``time_to_accuracy.png``: validation accuracy against the epoch line's cumulative training time, as the DLI course
plots it, drawn by rank 0 from the run's record (``metrics.csv``, callbacks/run_record.py) when training ends."""

from pathlib import Path
from typing import List, Optional

from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.run_record import EpochRecord, read_epochs, write_records
from callbacks.stop_at_target import StopAtTarget

PLOT_NAME = "time_to_accuracy.png"


def plot(path: Path, records: List[EpochRecord], target: Optional[float] = None) -> bool:
    """Accuracy against seconds, epoch numbers above the points; False when there is nothing to draw."""
    points = [r for r in records if r.val_acc is not None and r.cumulative_s is not None]
    if not points:
        return False
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    axes.plot([0.0] + [r.cumulative_s for r in points], [0.0] + [r.val_acc for r in points], marker="o")
    for record in points:
        axes.annotate(str(record.epoch), (record.cumulative_s, record.val_acc), textcoords="offset points",
                      xytext=(0, 6), fontsize=8)
    if target is not None:
        axes.axhline(target, linestyle="--", color="grey", label=f"target {target:g}")
        axes.legend(loc="lower right")
    axes.set_xlabel("cumulative training time (s)")
    axes.set_ylabel("validation accuracy")
    axes.set_title("Time to accuracy (epoch numbers above the points)")
    axes.grid(alpha=0.3)
    figure.savefig(path, dpi=100)
    return True


class TimeToAccuracy(Callback):
    """Draws ``time_to_accuracy.png`` in the run's folder (or ``output_dir``) when training ends; with
    ``--target_accuracy`` the target is a dashed line.

    Args:
        output_dir: Folder for the picture; default: the run's folder (where ``metrics.csv`` is)."""

    def __init__(self, output_dir: Optional[str] = None) -> None:
        self.output_dir = output_dir
        self._run_dir: Optional[Path] = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._run_dir = Path(trainer.log_dir or ".")  # log_dir is a collective: every rank asks

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        write_records(trainer)  # the last epoch's rows, before they are read back
        if trainer.is_global_zero and self._run_dir is not None:
            target = next((c.target_accuracy for c in trainer.callbacks if isinstance(c, StopAtTarget)), None)
            folder = Path(self.output_dir) if self.output_dir else self._run_dir
            folder.mkdir(parents=True, exist_ok=True)
            plot(folder / PLOT_NAME, read_epochs(self._run_dir), target)
