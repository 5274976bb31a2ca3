"""Preemption: SIGTERM, SLURM's SIGUSR1 or Ctrl-C stop every rank at the same step with a verified ``last.ckpt``.

The handlers only note the signal. At the next decision point (fashion_mnist_dp/runtime/agreement.py) the ranks learn
what any of them received; then the stop runs in this order, and no rank exits before its end:
every rank takes part in saving ``last.ckpt`` (rank 0 writes it and reads it back against its sha256);
rank 0 runs ``scontrol requeue`` once for SIGUSR1 under SLURM and prints the stop's line; a barrier; every rank
raises :class:`~runtime.errors.Preempted`: exit 143 (SIGTERM, SIGUSR1) or 130 (Ctrl-C). From the decision on, a
signal belongs to the same stop (the requeue's own SIGTERM reaches every task while rank 0 is still printing), and
no task's exit can let ``srun --kill-on-bad-exit`` end rank 0 before it requeued (docs/running-on-clusters.md,
"Preemption, step by step"). Under ``accumulate_grad_batches`` > 1 the stop waits for the optimizer step.
Outside training there is no step to stop at: 143 or 130 at once, with one line, also while the rendezvous waits.
A second Ctrl-C during training, before a stop is under way, stops at once.
Under srun, SIGUSR2 from a failed task of the same step (runtime.lifetime.end_peer_tasks) ends this task at once,
in or outside training, with one line and exit 1: the failed task's own line and code say why.
Lightning's own handlers are off (fashion_mnist_dp/runtime/compat.py).
"""

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, List, Optional

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from fashion_mnist_dp.runtime import compat, errors
from fashion_mnist_dp.runtime.agreement import BEFORE_SAVE, EPOCH_END, Participant
from fashion_mnist_dp.runtime.checkpoint_io import sidecar_path, verify
from fashion_mnist_dp.runtime.errors import ExitCode, Preempted
from fashion_mnist_dp.runtime.lifetime import PEER_FAILED, probably_global_rank_zero, srun_step

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)  # order of the flags
_received = [False, False, False]  # per SIGNALS, in this process
_in_training = False  # between on_train_start and on_train_end: defer to the next decision point
_stopping = False  # a stop is under way: every later signal belongs to it


def _handler(signum, frame) -> None:
    """Note the signal for the next decision point; outside training :func:`watch_outside_training` ends the process."""
    index = SIGNALS.index(signum)
    if signum == signal.SIGINT and _received[index] and _in_training and not _stopping:
        raise KeyboardInterrupt  # second Ctrl-C: stop at once
    _received[index] = True


def _peer_failed_handler(signum, frame) -> None:
    """Nothing here: the signal's wakeup byte makes :func:`watch_outside_training`'s thread end the process."""


def install_handlers() -> None:
    """Note SIGTERM, SIGUSR1 and SIGINT in this process; under srun, also wake on a failed peer's SIGUSR2 (main
    thread only)."""
    for signum in SIGNALS:
        signal.signal(signum, _handler)
    if srun_step() is not None:
        signal.signal(PEER_FAILED, _peer_failed_handler)


def _exit_peer_failed() -> None:
    rank = os.environ.get("SLURM_PROCID", "?")
    print(f"train.py: rank {rank}: stopped because another task of SLURM step {srun_step()} failed (its own line "
          f"says why)", file=sys.stderr, flush=True)
    os._exit(int(ExitCode.PEER_FAILED))


def _exit_outside_training(signum: int) -> None:
    interrupted = signum == signal.SIGINT
    if probably_global_rank_zero():
        what = "interrupted (Ctrl-C)" if interrupted else f"stopped by {signal.Signals(signum).name}"
        print(f"train.py: {what} outside training: no step to stop at, nothing saved", file=sys.stderr, flush=True)
    os._exit(int(ExitCode.INTERRUPTED if interrupted else ExitCode.PREEMPTED))  # the ranks it started die with it


def watch_outside_training() -> Callable[[], None]:
    """Outside training a signal ends the process at once, from a thread woken by the signal's wakeup byte: the main
    thread may be waiting inside torch (the rendezvous, a first collective) for the whole collective timeout, and a
    Python handler runs only when that call returns. Returns the function that stops watching."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while data := os.read(read_fd, 64):
            for signum in data:
                if signum == PEER_FAILED and signal.getsignal(PEER_FAILED) is _peer_failed_handler:
                    _exit_peer_failed()  # in training too: the failed task will not take part again
                if signum in SIGNALS and not _in_training and not _stopping:
                    _exit_outside_training(signum)

    thread = threading.Thread(target=watch, name="signals-outside-training", daemon=True)
    thread.start()

    def stop() -> None:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the thread reads the end of the pipe and returns
        thread.join(timeout=1)
        os.close(read_fd)

    return stop


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


class Preemption(Participant):
    """Stops every rank at the same decision point after a signal, with a verified ``last.ckpt``."""

    size = len(SIGNALS)

    def __init__(self) -> None:
        self._requeued = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        compat.disable_lightning_signal_handling(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        global _in_training, _stopping
        install_handlers()  # again, in case anything replaced them since start-up
        _in_training, _stopping = True, False

    def on_train_end(self, *_) -> None:  # also on_exception
        global _in_training
        _in_training = False

    on_exception = on_train_end

    def contribute(self, trainer: Trainer, pl_module: LightningModule, point: str) -> torch.Tensor:
        return torch.tensor([float(x) for x in _received], device=pl_module.device)

    def decide(self, trainer: Trainer, pl_module: LightningModule, point: str, rows: List[List[float]]) -> None:
        """Stop now, unless this point is inside another save, between two optimizer steps (accumulated gradients
        would be lost), or after the epoch's last batch but before its end (the stop waits for the epoch's end, so
        its checkpoint is an end-of-epoch one). The flags stay set: the ranks decide again at the next point."""
        flags = [any(row[i] for row in rows) for i in range(self.size)]
        if not any(flags) or point == BEFORE_SAVE or compat.between_optimizer_steps(trainer):
            return
        done, total = trainer.fit_loop.epoch_loop.batch_progress.current.processed, trainer.num_training_batches
        if point != EPOCH_END and isinstance(total, int) and done >= total:
            return
        interrupted, terminated, usr1 = flags
        name = "SIGUSR1" if usr1 else "SIGTERM" if terminated else "SIGINT (Ctrl-C)"
        exit_code = ExitCode.PREEMPTED if terminated or usr1 else ExitCode.INTERRUPTED
        global _stopping
        _stopping = True
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # every rank takes part; rank 0 writes, then a barrier
        message = f"stopped by {name} at optimizer step {trainer.global_step} (epoch {trainer.current_epoch + 1})"
        if trainer.is_global_zero:
            digest = verify(path)  # raises CheckpointCorruptError (exit 66) if it did not read back
            check = f"sha256 {digest[:12]}, {sidecar_path(path).name}" if digest else "no sha256 (remote path)"
            message += f": checkpoint saved and verified: {path} ({check}); resume with --ckpt_path last"
            job_id = slurm_job_id()
            if usr1 and job_id is not None and not self._requeued:
                self._requeued = True
                message += f"; {requeue(job_id)}"
        stop = Preempted(message, int(exit_code), rank=trainer.global_rank, children=compat.release_children(trainer))
        if trainer.is_global_zero:
            errors.print_line(stop)
        trainer.strategy.barrier("preempted")  # no rank ends before rank 0 has requeued and printed
        raise stop
