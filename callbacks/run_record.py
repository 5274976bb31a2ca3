"""A run's results as data: ``metrics.csv`` in the run folder beside TensorBoard's event files and ``hparams.yaml``,
written through Lightning's logging, and the readers tools use instead of stdout (benchmarks/, experiments/).

Every metric a run logs is a row of ``metrics.csv`` (``step``, ``epoch`` from 0, then one column per tag). The
per-epoch record is the rows of one epoch taken together (:func:`read_epochs`): the epoch line's cumulative training
time and images/sec, validation loss and accuracy, and ``train/diverged`` when the run stopped there diverged; the
test's figures are the ``test/*`` columns (:func:`read_latest`). docs/reporting.md."""

import csv
import io
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams as tensorboard_hparams

from callbacks.owner import each
from lightning_modules.lr_policy import describe_run

FILE_NAME = "metrics.csv"
HPARAMS_METRICS = ("val/acc", "val/loss", "throughput/images_per_sec")


class MetricsCSV(TensorBoardLogger):
    """TensorBoard's logger that also writes ``metrics.csv`` in its run folder: Lightning's CSVLogger beside it would
    pick a version of its own and erase the file when a run continues in its folder; here a resumed run
    (``--ckpt_path last``) keeps the rows before the step it resumes from (TensorBoard purges the same ones) and
    appends. ``save_dir`` and ``name`` null: train.py fills in ``default_root_dir`` and the run's name. Rank 0 writes;
    every write replaces the file whole (a reader never sees half a row)."""

    def __init__(self, save_dir: Optional[str] = None, name: Optional[str] = None,
                 version: Optional[Union[int, str]] = None, default_hp_metric: bool = False,
                 purge_step: Optional[int] = None, write_every_s: float = 5.0, **kwargs: Any) -> None:
        """``purge_step``: SummaryWriter's; train.py sets it (and ``version``) to continue a resumed run's folder.
        ``write_every_s``: between the writes :meth:`write_now` makes, the files are written at most this often."""
        super().__init__(save_dir or "runs", name=name, version=version, default_hp_metric=default_hp_metric,
                         purge_step=purge_step, **kwargs)
        self.run_name = version
        self.rows: Optional[List[Dict[str, Any]]] = None  # loaded at the first row
        self.purge_step = purge_step
        self.write_every_s = write_every_s
        self._written: Tuple[int, List[str], str] = (0, [], "")  # rows in the file, its columns, its text
        self._written_at = -float("inf")  # time.monotonic() of the last write

    @property
    def version(self) -> Union[int, str]:
        """The run's folder: its name given (``version``, or a resumed run's), or set before the run starts (train.py
        makes a new run's folder: ``20261201-233431-seed42``); else Lightning's next ``version_N``."""
        return self.run_name if self.run_name is not None else super().version

    @version.setter
    def version(self, name: str) -> None:
        self.run_name = name

    @property
    def path(self) -> Path:
        return Path(self.log_dir) / FILE_NAME

    @rank_zero_only
    def log_metrics(self, metrics: Dict[str, float], step: Optional[int] = None) -> None:
        """Every value to both files, but ``epoch`` (which Lightning adds) to metrics.csv only: TensorBoard's x-axis is
        the step, and a chart of a few epoch numbers is drawn off the plot there (docs/reporting.md)."""
        super().log_metrics({key: value for key, value in metrics.items() if key != "epoch"}, step)
        if self.rows is None:
            resumed_at = self.purge_step or 0
            self.rows = [row for row in read_rows(self.path) if float(row.get("step") or 0) < resumed_at]
        self.rows.append({"step": step, **{key: float(value) for key, value in metrics.items()}})

    @rank_zero_only
    def save(self) -> None:
        """What Lightning calls at every log step: a write once ``write_every_s`` have passed since the last. A write
        is host time on that step (TensorBoard's flush waits for its writer thread; metrics.csv is replaced whole),
        so steps between writes only keep their rows; :meth:`write_now` is called wherever a row must be on disk."""
        if time.monotonic() - self._written_at >= self.write_every_s:
            self.write_now()

    @rank_zero_only
    def write_now(self) -> None:
        """Flush TensorBoard and replace metrics.csv whole with every row. Only the rows since the last write are
        formatted (the text before them is kept while the columns stay the same). Called by RunRecord at each
        checkpoint and each epoch's start, by a stop, and at the run's end (``finalize``)."""
        self._written_at = time.monotonic()
        super().save()
        count, columns, text = self._written
        if not self.rows or count == len(self.rows):
            return
        new = self.rows[count:]
        if not count or not {key for row in new for key in row} <= set(columns):
            columns = list(dict.fromkeys(key for row in self.rows for key in row))
            columns = ["step", "epoch"] + [c for c in columns if c not in ("step", "epoch")]
            new, text = self.rows, ""
        buffer = io.StringIO(text)
        buffer.seek(len(text))
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\r\n")
        if not text:
            writer.writeheader()
        writer.writerows(new)
        text = buffer.getvalue()
        partial = self.path.with_name(f".{FILE_NAME}.tmp-{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "w", newline="") as handle:
                handle.write(text)
            os.replace(partial, self.path)
        except OSError as error:  # a full disk: the old file stays whole, and no partial one is left
            partial.unlink(missing_ok=True)
            raise OSError(error.errno, error.strerror, str(self.path)) from error
        self._written = (len(self.rows), columns, text)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """On a failure path (Lightning's ``_interrupt``) a write that fails must not raise over the failure: it is
        named in the stop line instead."""
        failed = None
        try:
            super().finalize(status)
            self.write_now()
        except OSError as error:
            if status == "success":
                raise
            failed = error
        handled = sys.exc_info()[1]  # out of the except block: the exception being handled is the run's, not this one
        if failed is not None and handled is not None:
            handled.add_note(f"{FILE_NAME} not written either: {failed.strerror or failed}")


def public_hparams(params: Dict[str, Any]) -> Dict[str, Any]:
    """A module's hyperparameters without LightningCLI's ``_instantiator`` (how it was built, not a setting)."""
    return {key: value for key, value in params.items() if key != "_instantiator"}


def read_rows(path: Union[str, Path]) -> List[Dict[str, str]]:
    """The rows of a ``metrics.csv`` as written (empty cells are ""); [] when there is no file."""
    try:
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))
    except FileNotFoundError:
        return []


def _numbers(row: Dict[str, str]) -> Dict[str, float]:
    return {key: float(text) for key, text in row.items() if text not in (None, "")}


@dataclass(frozen=True)
class EpochRecord:
    """One training epoch as its line reports it (None: not measured, e.g. no validation ran in that epoch)."""

    epoch: int  # from 1, as the epoch line counts
    cumulative_s: Optional[float]
    images_per_sec: Optional[float]
    val_loss: Optional[float]
    val_acc: Optional[float]
    diverged: bool = False


def read_epochs(run_dir: Union[str, Path]) -> List[EpochRecord]:
    """The per-epoch record of the run in ``run_dir``, epoch by epoch: the last value of each tag in that epoch."""
    merged: Dict[int, Dict[str, float]] = {}
    for row in read_rows(Path(run_dir) / FILE_NAME):
        if row.get("epoch") in (None, ""):
            continue
        merged.setdefault(int(float(row["epoch"])), {}).update(_numbers(row))
    records = []
    for epoch, values in sorted(merged.items()):
        if "time/cumulative_s" in values or "val/acc" in values or "train/diverged" in values:
            records.append(EpochRecord(epoch + 1, values.get("time/cumulative_s"),
                                       values.get("throughput/images_per_sec"), values.get("val/loss"),
                                       values.get("val/acc"), bool(values.get("train/diverged"))))
    return records


def read_latest(run_dir: Union[str, Path]) -> Dict[str, float]:
    """The last value logged of every tag of the run in ``run_dir`` (``test/acc``, ``time/first_step_s``,
    ``memory/parameters_mb``...); {} when there is no record."""
    found: Dict[str, float] = {}
    for row in read_rows(Path(run_dir) / FILE_NAME):
        found.update(_numbers(row))
    return found


def run_dirs(root: Union[str, Path]) -> List[Path]:
    """The run folders (``<experiment>/<run>``) under ``root`` (a ``default_root_dir``) that hold a ``metrics.csv``,
    oldest first."""
    return sorted((p.parent for p in Path(root).glob(f"*/*/{FILE_NAME}")), key=lambda p: p.stat().st_mtime)


@dataclass(frozen=True)
class RunResults:
    """What a tool reads back from a run: its epochs and its test figures."""

    folder: Optional[Path]
    epochs: List[EpochRecord]
    latest: Dict[str, float]  # read_latest

    @property
    def test(self) -> Dict[str, float]:
        """The test's figures (``test/acc``, ``test/loss``...)."""
        return {key: value for key, value in self.latest.items() if key.startswith("test/")}


def read_run(root: Union[str, Path]) -> RunResults:
    """The newest run under ``root`` (a ``default_root_dir``, e.g. a scratch folder's ``runs``)."""
    found = run_dirs(root)
    if not found:
        return RunResults(None, [], {})
    return RunResults(found[-1], read_epochs(found[-1]), read_latest(found[-1]))


def write_records(trainer: Trainer) -> None:
    """Every logger's rows on disk now (a logger that writes on a timer, :class:`MetricsCSV`, included)."""
    for logger in trainer.loggers:
        getattr(logger, "write_now", logger.save)()


class RunRecord(Callback):
    """The run's hyperparameters with the numbers derived from them (batch plan, learning rates, strategy, training
    FLOPs per image and the device's peak: the start block's) to every logger when fit starts: ``hparams.yaml`` and
    TensorBoard's HPARAMS tab. The loggers' rows on disk whenever a checkpoint is written (a resume never lacks rows
    before its step) and at each epoch's start."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        write_records(trainer)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: Dict[str, Any]) -> None:
        write_records(trainer)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        params = public_hparams(pl_module.hparams)
        plan, rates = getattr(pl_module, "batch_plan", None), getattr(pl_module, "learning_rates", None)
        params.update(plan.as_dict() if plan is not None else {})
        params.update(asdict(rates) if rates is not None else {})
        params.update(describe_run(trainer))
        # ThroughputReport's setup counted its FLOPs and peak
        report = next((c for c in each(trainer.callbacks) if hasattr(c, "device_use")), None)
        params.update(report.device_use.params() if report is not None else {})
        for logger in trainer.loggers:
            logger.log_hyperparams(params)
            if isinstance(logger, TensorBoardLogger) and trainer.is_global_zero:
                # Columns tied to tags the run logs anyway (log_hyperparams with metrics would write fake scalars).
                plain = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in params.items()}
                for summary in tensorboard_hparams(plain, dict.fromkeys(HPARAMS_METRICS, 0.0)):
                    logger.experiment.file_writer.add_summary(summary)  # add_hparams would open a second run
