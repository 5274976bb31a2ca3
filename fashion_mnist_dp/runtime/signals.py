"""Signals: the one module that installs their handlers; what each does at each stage: docs/reliability.md, "Every
signal at every stage"."""

import ctypes
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Mapping, Optional

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from fashion_mnist_dp.exit_codes import ExitCode
from fashion_mnist_dp.runtime import compat, errors, hangs, runs
from fashion_mnist_dp.runtime.agreement import BEFORE_SAVE, EPOCH_END, Participant
from fashion_mnist_dp.runtime.checkpoint_io import sidecar_path, verify
from fashion_mnist_dp.runtime.errors import Preempted
from fashion_mnist_dp.runtime.lifetime import (LAUNCHER_PID_ENV, int_from, is_launched_rank, probably_global_rank_zero,
                                               release_process_group)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)  # order of the flags
PEER_FAILED = signal.SIGUSR2  # what a failing srun task sends the other tasks of its step
PR_SET_PDEATHSIG = 1


def set_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; whether the request took (elsewhere libc has no prctl:
    AttributeError)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(environ: Mapping[str, str] = os.environ) -> None:
    """In a launched rank, be SIGKILLed when the launcher dies (Linux); exit at once if it already has."""
    parent = os.getppid()  # before the request: a parent that dies before it took shows as a changed ppid below
    if not is_launched_rank(environ) or not set_death_signal():
        return
    lightning_rank = not ({"TORCHELASTIC_RUN_ID", "SLURM_PROCID"} & set(environ))  # torchrun/srun: the agent is parent
    launcher = environ.get(LAUNCHER_PID_ENV, "") if lightning_rank else ""
    if os.getppid() != parent or (launcher.isdigit() and int(launcher) != parent):
        os._exit(int(ExitCode.LAUNCHER_GONE))


def srun_step(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """``JOB.STEP`` when this process is one of several tasks srun started for one step, else None."""
    job, step = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_STEP_ID", "")
    if int_from(environ, "SLURM_STEP_NUM_TASKS") < 2 or not job.isdigit() or not step.isdigit():
        return None
    return f"{job}.{step}"


def end_peer_tasks(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """Under srun, a failing task sends :data:`PEER_FAILED` to every task of its step (``scancel --signal``; srun ends
    them only with ``--kill-on-bad-exit``) and ignores it itself; the step signalled, or None. Main thread only."""
    step = srun_step(environ)
    if step is None:
        return None
    signal.signal(PEER_FAILED, signal.SIG_IGN)
    try:
        result = subprocess.run(["scancel", "--quiet", f"--signal={PEER_FAILED.name[3:]}", step],
                                capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return step if result.returncode == 0 else None


def init_data_worker(worker_id: int) -> None:
    """``worker_init_fn``: die with the rank and leave the four signals to it (it stops its workers); its stacks on
    the rank's request (the hang report: runtime/hangs.py)."""
    for signum in (*SIGNALS, PEER_FAILED):
        signal.signal(signum, signal.SIG_IGN)
    hangs.dump_on_signal()
    rank = multiprocessing.parent_process()
    if set_death_signal() and rank is not None and os.getppid() != rank.pid:
        os._exit(int(ExitCode.PEER_FAILED))  # the rank died before the request took effect


class Handlers:
    """This process's signal state: which of :data:`SIGNALS` arrived, whether training runs, whether a stop is under
    way, and the code of a line already printed."""

    def __init__(self) -> None:
        self.received = [False] * len(SIGNALS)
        self.in_training = False
        self.stopping = False
        self.reported_exit: Optional[int] = None

    def exiting(self, code: int) -> None:
        """Its one line is out: a later signal (srun's SIGTERM after another task exited) ends it with ``code``."""
        self.reported_exit = code

    def on_signal(self, signum, frame) -> None:
        index = SIGNALS.index(signum)
        if signum == signal.SIGINT and self.received[index] and self.in_training and not self.stopping:
            raise KeyboardInterrupt  # second Ctrl-C: stop at once
        self.received[index] = True

    def on_peer_failed(self, signum, frame) -> None:
        """Nothing: the signal's wakeup byte makes the watching thread end the process."""

    def install(self) -> "Handlers":
        for signum in SIGNALS:
            signal.signal(signum, self.on_signal)
        if srun_step() is not None:
            signal.signal(PEER_FAILED, self.on_peer_failed)
        return self

    def watch(self) -> Callable[[], None]:
        """The thread that acts at once on a signal outside training (and on SIGUSR2 always); returns its stop."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def watch() -> None:
            while data := os.read(read_fd, 64):
                for signum in data:
                    if signum in SIGNALS and self.reported_exit is not None:
                        os._exit(self.reported_exit)  # its line is out: no second one (srun's SIGTERM after a peer)
                    if signum == PEER_FAILED and signal.getsignal(PEER_FAILED) == self.on_peer_failed:
                        _exit_peer_failed()  # in training too: the failed task will not take part again
                    if signum in SIGNALS and not self.in_training and not self.stopping:
                        _exit_outside_training(signum)

        thread = threading.Thread(target=watch, name="signals-outside-training", daemon=True)
        thread.start()

        def stop() -> None:
            signal.set_wakeup_fd(previous)
            os.close(write_fd)  # the thread reads the end of the pipe and returns
            thread.join(timeout=1)
            os.close(read_fd)

        return stop


def installed() -> Optional[Handlers]:
    """The :class:`Handlers` whose method handles SIGTERM now, if any."""
    owner = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return owner if isinstance(owner, Handlers) else None


@contextmanager
def guarded_process() -> Iterator[Handlers]:
    """A train.py process's start, undone when ``main`` returns: a rank dies with its launcher; our signal handlers
    (the previous ones back at the end); the process group released while the interpreter is whole."""
    die_with_parent()
    launcher_pid = os.environ.get(LAUNCHER_PID_ENV)
    if not is_launched_rank():  # a launching train.py: its ranks check that their parent is this pid (die_with_parent)
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    previous = {signum: signal.getsignal(signum) for signum in (*SIGNALS, PEER_FAILED)}
    handlers = Handlers().install()
    stop_watching = handlers.watch()
    try:
        yield handlers
    finally:
        release_process_group()  # under the handlers: a signal now ends the process with its code
        runs.release()  # the run's folder, for the next run of an in-process caller
        stop_watching()
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
        if launcher_pid is None:
            os.environ.pop(LAUNCHER_PID_ENV, None)
        else:
            os.environ[LAUNCHER_PID_ENV] = launcher_pid


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


def requeue(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """``scontrol requeue`` of this SLURM job (``<array job>_<task>`` for an array task); what happened, for the one
    line; None outside a job (or a job id that is not one)."""
    array_job, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array_job}_{task}" if array_job and task else environ.get("SLURM_JOB_ID")
    if not job_id or not re.fullmatch(r"[0-9]+(_[0-9]+)?", job_id):
        return None
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"requeue of SLURM job {job_id} failed: {error}"
    if result.returncode != 0:
        detail = " ".join((result.stderr or result.stdout).split())[:200]
        return f"requeue of SLURM job {job_id} failed (scontrol exit {result.returncode}: {detail})"
    return f"SLURM job {job_id} requeued"


def last_checkpoint_path(trainer: Trainer) -> Path:
    """``last.ckpt`` where ``--ckpt_path last`` looks: the folder of the ModelCheckpoint named ``last``, else one with
    ``save_last``, else the first."""
    callbacks = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    ranked = ([cb for cb in callbacks if cb.filename == ModelCheckpoint.CHECKPOINT_NAME_LAST]
              + [cb for cb in callbacks if cb.save_last] + callbacks)
    folder = Path(ranked[0].dirpath) if ranked else Path(trainer.default_root_dir) / "checkpoints"
    return folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"


class Preemption(Participant):
    """Stops every rank at the same decision point after a signal, with a verified ``last.ckpt``."""

    def __init__(self) -> None:
        self.handlers = Handlers()  # until setup finds train.py's

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        compat.disable_lightning_signal_handling(trainer)
        self.handlers = installed() or self.handlers

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.handlers.install()  # again, in case anything replaced them since start-up
        self.handlers.in_training, self.handlers.stopping = True, False

    def on_train_end(self, *_) -> None:  # also on_exception
        self.handlers.in_training = False

    on_exception = on_train_end

    def contribute(self, trainer: Trainer, pl_module: LightningModule, point: str) -> torch.Tensor:
        return torch.tensor([float(x) for x in self.handlers.received], device=pl_module.device)

    def decide(self, trainer: Trainer, pl_module: LightningModule, point: str, rows: List[List[float]]) -> None:
        """Stop now, unless this point is inside a save, between two optimizer steps, or after the epoch's last batch
        but before its end; the flags stay set for the next point."""
        flags = [any(column) for column in zip(*rows)]  # per signal of SIGNALS: whether any rank received it
        if not any(flags) or point == BEFORE_SAVE or compat.between_optimizer_steps(trainer):
            return
        done, total = trainer.fit_loop.epoch_loop.batch_progress.current.processed, trainer.num_training_batches
        if point != EPOCH_END and done >= total:  # total: inf for a loader without a length
            return
        interrupted, terminated, usr1 = flags
        name = "SIGUSR1" if usr1 else "SIGTERM" if terminated else "SIGINT (Ctrl-C)"
        exit_code = ExitCode.PREEMPTED if terminated or usr1 else ExitCode.INTERRUPTED
        self.handlers.stopping = True
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # every rank takes part; rank 0 writes, then a barrier
        message = f"stopped by {name} at optimizer step {trainer.global_step} (epoch {trainer.current_epoch + 1})"
        if trainer.is_global_zero:
            digest = verify(path)  # raises CheckpointError (exit 66) if it did not read back
            check = f"sha256 {digest[:12]}, {sidecar_path(path).name}" if digest else "no sha256 (remote path)"
            message += f": checkpoint saved and verified: {path} ({check}); resume with --ckpt_path last"
            if usr1 and (requeued := requeue()):
                message += f"; {requeued}"
        children = compat.launched_children(trainer, release=True)
        stop = Preempted(message, int(exit_code), rank=trainer.global_rank, children=children)
        if trainer.is_global_zero:
            errors.print_line(stop)
        trainer.strategy.barrier("preempted")  # no rank ends before rank 0 has requeued and printed
        raise stop
