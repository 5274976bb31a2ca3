"""Everything that keeps a run safe; the story of each Lightning gap: docs/reliability.md."""

import os
from contextlib import contextmanager
from typing import Iterator, List

from lightning.pytorch import Trainer

from fashion_mnist_dp.runtime.agreement import DEFAULT_CHECK_EVERY_N_STEPS, Agreement, TrainingLoss, check_order
from fashion_mnist_dp.runtime.checkpoint_io import VerifiedCheckpointIO
from fashion_mnist_dp.runtime.divergence import DivergenceGuard
from fashion_mnist_dp.runtime.faults import JobFaults
from fashion_mnist_dp.runtime.lifetime import LAUNCHER_PID_ENV, is_launched_rank, release_process_group
from fashion_mnist_dp.runtime.signals import (PEER_FAILED, SIGNALS, Handlers, Preemption, die_with_parent,
                                              end_peer_tasks, handled)
from fashion_mnist_dp.runtime.resume import RngState, TensorBoardRun

__all__ = ["Agreement", "DEFAULT_CHECK_EVERY_N_STEPS", "DivergenceGuard", "JobFaults", "PEER_FAILED", "Preemption",
           "RngState", "SIGNALS", "TensorBoardRun", "TrainingLoss", "VerifiedCheckpointIO", "check_order",
           "end_peer_tasks", "guarded_process", "safety_off"]

# The run-safety callbacks and plugin configs/default.yaml lists, with the guarantee each carries (docs/reliability.md).
SAFETY = {
    JobFaults: "on a lost rank or a stalled data worker: no collective save, the job ends with one line",
    DivergenceGuard: "a diverged run stops with advice (exit 70) and saves no diverged checkpoint",
    Preemption: "SIGTERM, SIGUSR1 or Ctrl-C: every rank stops at one point with a verified last.ckpt",
    Agreement: "the decision points: without it divergence and signals are never acted on",
    RngState: "a resumed run draws the batches the uninterrupted run would have",
    TensorBoardRun: "a resumed run continues its TensorBoard folder and metrics.csv",
    VerifiedCheckpointIO: "checkpoints written atomically with a checksum, verified and code-free on load",
}


def safety_off(trainer: Trainer) -> List[str]:
    """The start block's line for each run-safety callback or plugin ``trainer`` runs without."""
    present = {type(c) for c in trainer.callbacks} | {type(trainer.strategy.checkpoint_io)}
    return [f"  safety off      : {kind.__name__}: {guarantee}" for kind, guarantee in SAFETY.items()
            if not any(issubclass(p, kind) for p in present)]


@contextmanager
def guarded_process() -> Iterator[Handlers]:
    """A train.py process's start, undone when ``main`` returns: a rank dies with its launcher; signal handlers; the
    process group released while the interpreter is whole."""
    die_with_parent()
    launcher_pid = os.environ.get(LAUNCHER_PID_ENV)
    if not is_launched_rank():  # a launching train.py: its ranks check that their parent is this pid (die_with_parent)
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        with handled() as handlers:
            try:
                yield handlers
            finally:
                release_process_group()  # under the handlers: a signal now ends the process with its code
    finally:
        if launcher_pid is None:
            os.environ.pop(LAUNCHER_PID_ENV, None)
        else:
            os.environ[LAUNCHER_PID_ENV] = launcher_pid
