"""Seeded, deterministic training runs started once per session, for tests/test_determinism.py and
tests/test_restarts.py: each is ``python train.py ... --seed 7 --deterministic true`` as a user types it.

``single``: the cnn (dropout draws random numbers every step), one process, 2 epochs. ``ddp``: the mlp, 2 gloo
ranks × batch 32 = 4 optimizer steps per epoch, ``RESTARTS + 1`` epochs, the clean run the torchrun restart job
(the same command) is compared with. ``get(kind, copy)``: copies 0 and 1 are two runs of the same command.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks.launch import clean_env, running_in, start_all, stop
from tests.conftest import TRAIN_PY, run_train, experiment_dir, run_dir

# torchrun restarts in tests/test_restarts.py: one per attempt but the last, 10 as docs/reliability.md promises (each
# attempt costs ~10 s of start-up on 2 cores, mostly imports; FASHION_MNIST_TEST_RESTARTS=3 for a quicker check).
RESTARTS = int(os.environ.get("FASHION_MNIST_TEST_RESTARTS", "10"))
STEPS_PER_EPOCH = 4  # 256 images / (2 ranks x 32)
SEED = ["--seed", "7", "--deterministic", "true", "--test_after_fit", "false", "--trainer.log_every_n_steps", "1"]
SINGLE = ["--network", "cnn", "--batch_size", "32", "--epochs", "2", *SEED]
DDP = ["--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--network", "mlp", "--batch_size", "32",
       "--epochs", str(RESTARTS + 1), *SEED]
ARGS = {"single": SINGLE, "ddp": DDP}
TIMEOUT_S = 180
# Tags whose values depend only on the seed (not on clocks or on how many processes were started).
DETERMINISTIC_TAGS = ("train/loss", "val/loss", "val/acc", "val/acc_low95", "val/acc_high95", "lr-SGD/pg1", "lr-SGD/pg2")


def run_folder(cwd: Path) -> Path:
    return run_dir(cwd)


def last_checkpoint(cwd: Path) -> dict:
    return torch.load(run_dir(cwd) / "checkpoints" / "last.ckpt", map_location="cpu",
                      weights_only=False)


def scalars(folder: Path) -> Dict[str, List[Tuple[int, float]]]:
    """tag -> [(step, value)] of one TensorBoard run folder as TensorBoard shows it: every event file of the folder
    read in order, events purged by a later writer's ``purge_step`` left out."""
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def wait_then_stop(job, timeout_s: float) -> List[int]:
    """Wait for ``job`` (hard timeout), then the pids still running in its folder 5 s after it exited, then stop all."""
    deadline = time.monotonic() + timeout_s
    while not job.exited() and time.monotonic() < deadline:
        time.sleep(0.2)
    exited = job.exited()
    grace = time.monotonic() + 5
    while running_in(job.cwd) and time.monotonic() < grace:
        time.sleep(0.1)
    left = running_in(job.cwd)
    stop([job])
    assert exited, f"timed out after {timeout_s:.0f} s:\n{job.tail()}"
    return left


@dataclass
class Run:
    cwd: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def checkpoint(self) -> dict:
        return last_checkpoint(self.cwd)

    @property
    def scalars(self) -> Dict[str, List[Tuple[int, float]]]:
        return scalars(run_folder(self.cwd))


class SeededRuns:
    def __init__(self, data_root: Path, base: Path) -> None:
        self.data_root = data_root
        self.base = base
        self.cache: Dict[Tuple[str, int], Run] = {}

    def get(self, kind: str, copy: int = 0) -> Run:
        if (kind, copy) not in self.cache:
            cwd = self.base / f"{kind}{copy}"
            cwd.mkdir(parents=True)
            argv = [*ARGS[kind], "--data_dir", str(self.data_root)]
            if kind == "single":
                result = run_train(argv, cwd=cwd, timeout=TIMEOUT_S)
                run = Run(cwd, result.returncode, result.stdout, result.stderr)
            else:  # Lightning's launcher starts rank 1: hard timeout, nothing of the job left behind
                (job,) = start_all([(kind, [str(TRAIN_PY), *argv], cwd, clean_env())], self.base / "logs")
                left = wait_then_stop(job, TIMEOUT_S)
                assert left == [], f"processes left: {left}"
                run = Run(cwd, job.returncode, job.stdout, job.stderr)
            assert run.returncode == 0, f"train.py {' '.join(argv)}\n{run.stderr[-4000:]}"
            self.cache[(kind, copy)] = run
        return self.cache[(kind, copy)]
