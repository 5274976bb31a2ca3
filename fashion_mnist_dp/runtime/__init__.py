"""Everything that keeps a run safe: exit codes and user-facing errors (errors), the ranks' one agreement per decision
point (agreement), divergence, preemption, faults of the job, resume, verified checkpoint IO, process lifetime, and
every private Lightning access (compat). The story of each Lightning gap: docs/reliability.md.
"""

import os
import signal
from contextlib import contextmanager
from typing import Iterator

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Checkpoint

from fashion_mnist_dp.runtime.agreement import DEFAULT_CHECK_EVERY_N_STEPS, Agreement, TrainingLoss
from fashion_mnist_dp.runtime.checkpoint_io import VerifiedCheckpointIO
from fashion_mnist_dp.runtime.divergence import DivergenceGuard
from fashion_mnist_dp.runtime.faults import JobFaults
from fashion_mnist_dp.runtime.lifetime import LAUNCHER_PID_ENV, PEER_FAILED, die_with_parent, mark_launcher
from fashion_mnist_dp.runtime.preemption import SIGNALS, Preemption, install_handlers, watch_outside_training
from fashion_mnist_dp.runtime.resume import RngState, TensorBoardRun

__all__ = ["DEFAULT_CHECK_EVERY_N_STEPS", "install", "guarded_process"]


def install(trainer: Trainer, check_every_n_steps: int = DEFAULT_CHECK_EVERY_N_STEPS) -> None:
    """Add the always-on callbacks to ``trainer``, in this order:

    1. ``JobFaults``, first of all: its ``on_exception`` must run before the checkpoint callbacks' (no collective
       save with a rank that is gone).
    2. after the user's callbacks but before the checkpoint callbacks (which Lightning puts last when it builds the
       trainer, so that every decision below precedes every save), the participants of the agreement:
       ``DivergenceGuard`` before ``Preemption`` (a diverged run stops without the checkpoint a signal would write),
       then ``TrainingLoss`` (the mean loss the progress bar shows);
    3. ``Agreement``, after its participants: at a decision point it reads what they noted for this batch;
    4. ``RngState`` and ``TensorBoardRun``: state saved with every checkpoint.

    The strategy's plain CheckpointIO becomes :class:`VerifiedCheckpointIO` (one given as a plugin is kept).
    """
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = VerifiedCheckpointIO()
    participants = [DivergenceGuard(), Preemption(), TrainingLoss()]
    callbacks = trainer.callbacks
    callbacks.insert(0, JobFaults())
    first_checkpoint = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
    callbacks[first_checkpoint:first_checkpoint] = [*participants, Agreement(participants, check_every_n_steps),
                                                    RngState(), TensorBoardRun()]


@contextmanager
def guarded_process() -> Iterator[None]:
    """What every train.py process does first, undone when ``main`` returns (it may run inside a caller's process):
    a launched rank dies with its launcher, the launcher tells its ranks its pid, and SIGTERM / SIGUSR1 / Ctrl-C
    are noted for the next decision point during training, and end the process at once outside it."""
    die_with_parent()
    launcher_pid = os.environ.get(LAUNCHER_PID_ENV)
    mark_launcher()
    previous = {signum: signal.getsignal(signum) for signum in (*SIGNALS, PEER_FAILED)}
    install_handlers()
    stop_watching = watch_outside_training()
    try:
        yield
    finally:
        stop_watching()
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
        if launcher_pid is None:
            os.environ.pop(LAUNCHER_PID_ENV, None)
        else:
            os.environ[LAUNCHER_PID_ENV] = launcher_pid
