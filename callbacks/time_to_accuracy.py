"""``time_to_accuracy.csv`` (and ``.png``): validation accuracy against the epoch line's cumulative training time,
one row per epoch, rewritten every epoch by rank 0 in the run's folder; the plot is drawn when training ends."""

import csv
from pathlib import Path
from typing import List, Optional

from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.throughput import ThroughputReport

CSV_NAME = "time_to_accuracy.csv"
PLOT_NAME = "time_to_accuracy.png"
COLUMNS = ["epoch", "cumulative_s", "val_acc", "val_loss"]


def write_csv(path: Path, rows: List[list]) -> None:
    """Floats as Python writes them (shortest exact form), so the file holds the very numbers logged."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(["" if v is None else v for v in row] for row in rows)


def plot(path: Path, rows: List[list], target: Optional[float] = None) -> bool:
    """Accuracy against seconds, like the DLI course's plot; returns False when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no display needed
    except ImportError:
        return False
    points = [(row[1], row[2]) for row in rows if row[2] is not None]
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    axes.plot([0.0] + [s for s, _ in points], [0.0] + [a for _, a in points], marker="o")
    for (seconds, accuracy), row in zip(points, [r for r in rows if r[2] is not None]):
        axes.annotate(str(row[0]), (seconds, accuracy), textcoords="offset points", xytext=(0, 6), fontsize=8)
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
    """Writes ``time_to_accuracy.csv``: epoch, cumulative_s, val_acc, val_loss (empty when no validation ran).

    Args:
        output_dir: Folder for the files; default: the run's log folder (runs/fashion_mnist/version_N).
    """

    def __init__(self, output_dir: Optional[str] = None) -> None:
        self.output_dir = output_dir
        self.rows: List[list] = []
        self._validated = False
        self._report: Optional[ThroughputReport] = None
        self._folder: Optional[Path] = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._report = ThroughputReport.of(trainer, self)
            self._folder = Path(self.output_dir or trainer.log_dir or ".")  # log_dir is a collective: every rank asks

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        validated, self._validated = self._validated, False
        logged = trainer.callback_metrics if validated else {}
        acc, loss = logged.get("val/acc"), logged.get("val/loss")
        self.rows.append([trainer.current_epoch + 1, self._report.cumulative_s,
                          None if acc is None else float(acc), None if loss is None else float(loss)])
        if trainer.is_global_zero:
            self._folder.mkdir(parents=True, exist_ok=True)
            write_csv(self._folder / CSV_NAME, self.rows)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero and self.rows:
            from callbacks.stop_at_target import StopAtTarget

            target = next((c.target_accuracy for c in trainer.callbacks if isinstance(c, StopAtTarget)), None)
            plot(self._folder / PLOT_NAME, self.rows, target)

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = [list(row) for row in state_dict.get("rows", [])]
