"""TensorBoard after a resume: the checkpoint's own run folder, continued from the checkpoint's step, no step twice.

Lightning's TensorBoardLogger starts a new ``version_N`` folder in every process, so a run resumed
with ``--ckpt_path last`` (after a crash, a preemption, a torchrun restart) showed up as a second
run whose first steps overlapped what the first process had logged after its last checkpoint:
two values for those steps of every tag.

* :class:`TensorBoardRun` (train.py adds it) stores in every checkpoint which run folder it belongs
  to: the TensorBoard logger's root (``save_dir/name``, absolute) and ``version``.
* :func:`continue_run` (train.py, before fit resumes with ``--ckpt_path last``): a TensorBoard logger
  with the same root logs into the checkpoint's version again, with ``purge_step`` = the checkpoint's
  global step. torch's SummaryWriter then writes a ``SessionLog.START`` event at that step, and
  TensorBoard drops every event of the run at a step >= it: what the stopped process logged after
  its checkpoint, which the resumed process logs again. TensorBoard's plugin accumulator ignores
  the *first* START of a run, so :func:`start_run` has every new run's writer open with one at
  step 0. (TensorBoard's Rust data server also drops a tag's events at steps >= a step logged
  again.) Everything an epoch logs lies below the step its checkpoint resumes from
  (callbacks/throughput.py logs epoch figures at the epoch's last step, as Lightning does ``val/*``).

``--ckpt_path FILE`` keeps Lightning's behaviour, a new version folder: training on from an older
checkpoint is a branch, and the original run stays visible. The logger's ``_version``, ``_kwargs``
and ``_experiment`` are Lightning's (2.6) private attributes; they are set before the writer exists,
so nothing has been written yet (tests/test_restarts.py reads the event files back).
"""

import os
from typing import Any, Dict, Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger


def _tensorboard_loggers(trainer: Trainer):
    return [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]


def _root(logger: TensorBoardLogger) -> str:
    return os.path.abspath(logger.root_dir)


class TensorBoardRun(Callback):
    """Saves the first TensorBoard logger's run folder (absolute root and version) with every checkpoint."""

    def __init__(self) -> None:
        self._logger: Optional[TensorBoardLogger] = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        loggers = _tensorboard_loggers(trainer)
        self._logger = loggers[0] if loggers else None

    def state_dict(self) -> Dict[str, Any]:
        if self._logger is None:
            return {}
        return {"root": _root(self._logger), "version": self._logger.version}


def _writer_not_open(logger: TensorBoardLogger) -> bool:
    return getattr(logger, "_experiment", None) is None and isinstance(getattr(logger, "_kwargs", None), dict)


def start_run(trainer: Trainer) -> None:
    """A new run: each TensorBoard writer opens with a START event at step 0 (see the module docstring)."""
    for logger in _tensorboard_loggers(trainer):
        if _writer_not_open(logger) and logger._kwargs.get("purge_step") is None:
            logger._kwargs["purge_step"] = 0  # LightningCLI fills in SummaryWriter's own default, None


def continue_run(trainer: Trainer, checkpoint: Dict[str, Any]) -> Optional[str]:
    """Log into the checkpoint's run folder from its global step on; returns that folder, or None (a new one)."""
    run = (checkpoint.get("callbacks") or {}).get(TensorBoardRun.__qualname__) or {}
    step = int(checkpoint.get("global_step", 0))
    continued = None
    for logger in _tensorboard_loggers(trainer):
        if not _writer_not_open(logger):
            continue
        if run.get("version") is not None and run.get("root") == _root(logger) and logger._version is None:
            logger._version = run["version"]
            logger._kwargs["purge_step"] = step
            continued = continued or logger.log_dir
        elif logger._kwargs.get("purge_step") is None:
            logger._kwargs["purge_step"] = 0
    return continued
