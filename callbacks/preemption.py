"""Preemption: SIGTERM, SLURM's SIGUSR1 or Ctrl-C stop every rank at the same step with a verified ``last.ckpt``.

Lightning 2.6.6 exits 0 after a SIGTERM (a scheduler reads "success"), writes no checkpoint, and
its handler runs a ``dist.broadcast`` inside the signal handler: a SIGTERM that reaches one rank
only, or arrives while the ranks are in another collective, desynchronises them until the
process-group timeout. Its SLURM handler (SIGUSR1) saves ``hpc_ckpt_N.ckpt`` and requeues, also
inside the handler, and then trains on.

Here the handlers (:func:`install_handlers`, called by train.py in every process) only note the
signal. During training, after every batch and after every validation, the ranks all-reduce what
they received (3 numbers in the one all_reduce shared with the divergence guard: callbacks/step_flags.py),
so a signal that reached any rank stops all of them at the same step (with ``accumulate_grad_batches`` > 1, at
the next optimizer step, so no accumulated gradient is lost). Lightning's own per-batch
broadcast of its SIGTERM flag is switched off with its handlers. Then every rank takes part in saving ``last.ckpt`` (rank 0 writes it with
a sha256 sidecar, checkpointing/verified_io.py), rank 0 reads it back and checks the sha256, and
every rank raises :class:`Preempted`: train.py prints one line on rank 0 and exits 143 (SIGTERM,
SIGUSR1) or 130 (Ctrl-C). For SIGUSR1 with ``SLURM_JOB_ID`` set, rank 0 also runs
``scontrol requeue <job id>`` once, after the checkpoint is verified. Lightning's own signal
handlers are not installed (``setup``), so nothing is requeued twice and no hpc checkpoint is written.

Outside the training loop (start-up, the test after fit) there is no step to stop at: SIGTERM and
SIGUSR1 end the process at once with 143, Ctrl-C with 130. A second Ctrl-C during training stops at
once too (Lightning's KeyboardInterrupt path).
"""

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks.divergence import _release_children
from callbacks.step_flags import TRAIN_BATCH, VALIDATION, CollectiveCallback
from checkpointing import sidecar_path, verify
from cli.errors import ExitCode

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)  # index in the all-reduced vector
EXIT_TERMINATED = int(ExitCode.PREEMPTED)  # 143 = 128 + SIGTERM
EXIT_INTERRUPTED = int(ExitCode.INTERRUPTED)  # 130 = 128 + SIGINT

_received = [False, False, False]  # per SIGNALS, in this process
_in_training = False  # between on_train_start and on_train_end: defer to the next decision point


class Preempted(RuntimeError):
    """Raised on every rank at the same step after the checkpoint was saved; ``exit_code`` 143 or 130."""

    def __init__(self, message: str, exit_code: int, rank: int = 0, children: Sequence = ()) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.rank = rank
        self.children = list(children)


def _handler(signum, frame) -> None:
    index = SIGNALS.index(signum)
    if signum == signal.SIGINT and _received[index]:
        raise KeyboardInterrupt  # second Ctrl-C: stop at once
    _received[index] = True
    if not _in_training:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(EXIT_TERMINATED)


def install_handlers() -> None:
    """Note SIGTERM, SIGUSR1 and SIGINT in this process (main thread only)."""
    for signum in SIGNALS:
        signal.signal(signum, _handler)


def received() -> List[bool]:
    return list(_received)


def slurm_job_id(environ=os.environ) -> Optional[str]:
    """``<array job>_<task>`` for an array task, else ``SLURM_JOB_ID``; None when absent or not a job id."""
    array_job, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array_job}_{task}" if array_job and task else environ.get("SLURM_JOB_ID")
    return job_id if job_id and re.fullmatch(r"[0-9]+(_[0-9]+)?", job_id) else None


def requeue(job_id: str) -> str:
    """``scontrol requeue JOB_ID``; what happened, for the one line."""
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"requeue of SLURM job {job_id} failed: {error}"
    if result.returncode != 0:
        detail = " ".join((result.stderr or result.stdout).split())[:200]
        return f"requeue of SLURM job {job_id} failed (scontrol exit {result.returncode}: {detail})"
    return f"SLURM job {job_id} requeued"


def last_checkpoint_path(trainer: Trainer) -> Path:
    """Where ``--ckpt_path last`` will look: the folder of the ModelCheckpoint named ``last`` (else one with
    ``save_last``, else the first with a folder), file ``last.ckpt``."""
    callbacks = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    ranked = ([cb for cb in callbacks if cb.filename == ModelCheckpoint.CHECKPOINT_NAME_LAST]
              + [cb for cb in callbacks if cb.save_last] + callbacks)
    folder = Path(ranked[0].dirpath) if ranked else Path(trainer.default_root_dir) / "checkpoints"
    return folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"


def _between_optimizer_steps(trainer: Trainer) -> bool:
    """True after a batch whose gradients wait for the next one (``accumulate_grad_batches`` > 1): a checkpoint
    there would lose them, so a stop waits for the optimizer step. The same on every rank (it depends only on the
    batch count)."""
    epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    should_accumulate = getattr(epoch_loop, "_should_accumulate", None)
    return bool(should_accumulate is not None and trainer.accumulate_grad_batches > 1 and should_accumulate())


class Preemption(CollectiveCallback):
    """Stops every rank at the same step after a signal, with a verified ``last.ckpt`` (train.py adds it)."""

    def __init__(self) -> None:
        self._requeued = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # Lightning's handlers run collectives (and SLURM's a save and a requeue) inside the signal handler.
        connector = getattr(trainer, "_signal_connector", None)
        if connector is not None and hasattr(connector, "register_signal_handlers"):
            connector.register_signal_handlers = lambda: None
        # Without its handlers Lightning's ``received_sigterm`` stays False, but its training loop still broadcasts
        # it from rank 0 before every batch (a collective and a host sync per batch, whose errors it swallows: a
        # stuck rank then costs two collective timeouts instead of one). This callback's flags replace it.
        epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if epoch_loop is not None and hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
            epoch_loop._broadcast_sigterm_tensor = lambda: None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        global _in_training
        install_handlers()  # again, in case anything replaced them since start-up
        _in_training = True

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        global _in_training
        _in_training = False

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        global _in_training
        _in_training = False

    def flags(self, trainer: Trainer, pl_module: LightningModule, point: str, outputs) -> torch.Tensor:
        """The signals this rank received so far: [SIGINT, SIGTERM, SIGUSR1], at every decision point."""
        return torch.tensor([float(x) for x in _received], device=pl_module.device)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        self._decide(trainer, pl_module, self.agreed_flags(trainer, pl_module, TRAIN_BATCH, outputs))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._decide(trainer, pl_module, self.agreed_flags(trainer, pl_module, VALIDATION))

    def _decide(self, trainer: Trainer, pl_module: LightningModule, flags) -> None:
        if not any(flags) or _between_optimizer_steps(trainer):
            return  # the flags stay set: the ranks decide again after the next batch
        interrupted, terminated, usr1 = (bool(x) for x in flags)
        name = "SIGUSR1" if usr1 else "SIGTERM" if terminated else "SIGINT (Ctrl-C)"
        exit_code = EXIT_TERMINATED if terminated or usr1 else EXIT_INTERRUPTED
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # every rank takes part; rank 0 writes, then a barrier
        where = f"{trainer.global_step} (epoch {trainer.current_epoch + 1})"
        message = f"stopped by {name} at optimizer step {where}"
        if trainer.is_global_zero:
            digest = verify(path)  # raises CheckpointCorruptError (exit 66) if it did not read back
            check = f"sha256 {digest[:12]}, {sidecar_path(path).name}" if digest else "no sha256 (remote path)"
            message += f": checkpoint saved and verified: {path} ({check}); resume with --ckpt_path last"
            job_id = slurm_job_id()
            if usr1 and job_id is not None and not self._requeued:
                self._requeued = True
                message += f"; {requeue(job_id)}"
        raise Preempted(message, exit_code, rank=trainer.global_rank, children=_release_children(trainer))
