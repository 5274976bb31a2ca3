"""Everything that keeps a run safe, by the names configs/default.yaml gives them; the story of each Lightning gap:
docs/reliability.md. It only hands names on: each lives in its own module."""

from fashion_mnist_dp.runtime.agreement import DEFAULT_CHECK_EVERY_N_STEPS, Agreement, TrainingLoss, check_order
from fashion_mnist_dp.runtime.checkpoint_io import VerifiedCheckpointIO
from fashion_mnist_dp.runtime.divergence import DivergenceGuard
from fashion_mnist_dp.runtime.faults import JobFaults
from fashion_mnist_dp.runtime.lifetime import exit_process
from fashion_mnist_dp.runtime.resume import RngState
from fashion_mnist_dp.runtime.safety import RunSafety
from fashion_mnist_dp.runtime.signals import PEER_FAILED, SIGNALS, Preemption, end_peer_tasks, guarded_process

__all__ = ["Agreement", "DEFAULT_CHECK_EVERY_N_STEPS", "DivergenceGuard", "JobFaults", "PEER_FAILED", "Preemption",
           "RngState", "RunSafety", "SIGNALS", "TrainingLoss", "VerifiedCheckpointIO", "check_order",
           "end_peer_tasks", "exit_process", "guarded_process"]
