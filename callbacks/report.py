"""The run's report in one callback: its record (hparams.yaml, metrics.csv at every checkpoint), the epoch line with
images/sec, FLOP/s and where each rank's step time goes, memory, time to accuracy, the test's pictures and predict's
rows, each step's learning rates, and validation placed so that an epoch's last share ends with its last batch
(docs/reporting.md)."""

from typing import List, Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_info

from callbacks.memory import PeakMemory
from callbacks.owner import Owner, each
from callbacks.pictures import TestPictures
from callbacks.predictions import PredictionCSV
from callbacks.run_record import RunRecord
from callbacks.throughput import ThroughputReport
from callbacks.time_to_accuracy import TimeToAccuracy


class ValidationAtEpochEnd(Callback):
    """With a fractional ``val_check_interval`` (0.5: twice an epoch) Lightning validates after every such share of an
    epoch's batches, so after its last batch only when their number divides (469 at 0.5: after batches 234 and 468).
    Here the last share ends with the last batch (234 and 469), so the epoch's line and its checkpoints hold the
    validation of its last weights: through the Trainer's ``val_check_batch`` (the batches between validations),
    which Lightning reads at every batch, set again at each epoch's start and after each validation."""

    def __init__(self) -> None:
        self.share: Optional[int] = None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        fraction, batches = trainer.val_check_interval, trainer.num_training_batches
        self.share = None  # batches counted across epochs, or an epoch of unknown length: Lightning's rule
        if isinstance(fraction, float) and isinstance(batches, int) and trainer.check_val_every_n_epoch is not None:
            self.share = trainer.val_check_batch = max(1, int(batches * fraction))  # Lightning's own share

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.share is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if done + 2 * self.share > trainer.num_training_batches:  # the next share would not end the epoch
            trainer.val_check_batch = trainer.num_training_batches


class Report(Owner):
    """Each part named by a key (false: left out). ``breakdown``, ``gpu_sample_every``, ``peak_flops`` and
    ``check_every_n_steps``: callbacks.ThroughputReport's (the epoch line, images/sec, the step-time breakdown, MFU;
    ``check_every_n_steps`` is linked from train.py's key, the windows of the breakdown)."""

    def __init__(self, check_every_n_steps: int = 50, breakdown: Optional[bool] = None, gpu_sample_every: int = 20,
                 peak_flops: Optional[float] = None, record: bool = True, memory: bool = True,
                 time_to_accuracy: bool = True, test_pictures: bool = True, predictions: bool = True,
                 validation_at_epoch_end: bool = True, learning_rates: bool = True) -> None:
        super().__init__([
            RunRecord() if record else None,
            ThroughputReport(breakdown, check_every_n_steps, gpu_sample_every, peak_flops),
            PeakMemory() if memory else None,
            TimeToAccuracy() if time_to_accuracy else None,
            TestPictures() if test_pictures else None,
            PredictionCSV() if predictions else None,
            ValidationAtEpochEnd() if validation_at_epoch_end else None,
            LearningRateMonitor(logging_interval="step") if learning_rates else None,  # lr-<optimizer>/pg<k>
        ])
        self.notes: List[str] = []  # the start block's lines train.py gives (what no key shows, the run's folder)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Its parts, then rank 0 prints the start block, assembled here from the model's numbers, train.py's lines
        and every callback's ``start_lines`` (its parts', the process settings')."""
        for call in self.calls["on_train_start"]:
            call(trainer, pl_module)
        if trainer.is_global_zero:
            own = [line for c in each(trainer.callbacks) if callable(getattr(c, "start_lines", None))
                   for line in c.start_lines(trainer)]
            model = pl_module.describe() if callable(getattr(pl_module, "describe", None)) else []
            rank_zero_info("\n".join(["Run configuration", *model, *self.notes, *own]))  # where Lightning's own go
