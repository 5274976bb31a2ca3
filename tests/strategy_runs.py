"""Short training runs of the mlp under different strategies, run once per session and shared by tests.

Each run is ``python train.py`` as a user types it, with ``tests.recorder.WeightsRecorder``
added; a run's result holds the process output, the full weights before and after training and what each
rank held (parameters, optimizer state, per-step loss).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import torch

from tests.conftest import run_train

# 256 training images: one epoch is 8 steps at an effective batch of 32.
COMMON = [
    "--accelerator", "cpu", "--network", "mlp", "--epochs", "1", "--test_after_fit", "false",
    "--trainer.limit_val_batches", "1", "--trainer.callbacks+=tests.recorder.WeightsRecorder",
]


@dataclass
class Run:
    cwd: Path
    stdout: str
    stderr: str
    initial: Dict[str, torch.Tensor]
    weights: Dict[str, torch.Tensor]
    shards: List[dict]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def moved(self) -> float:
        """How far training moved the weights (largest absolute change)."""
        return max((self.weights[k] - self.initial[k]).abs().max().item() for k in self.weights)

    def distance(self, other: "Run") -> float:
        """Largest absolute difference between two runs' weights."""
        return max((self.weights[k] - other.weights[k]).abs().max().item() for k in self.weights)


class StrategyRuns:
    def __init__(self, data_root: Path, base: Path) -> None:
        self.data_root = data_root
        self.base = base
        self.cache: Dict[tuple, Run] = {}

    def get(self, *args: str) -> Run:
        key = tuple(args)
        if key not in self.cache:
            cwd = self.base / f"run{len(self.cache)}"
            record = cwd / "record"
            record.mkdir(parents=True)
            full = [*COMMON, "--data_dir", str(self.data_root), *args]
            result = run_train(full, cwd=cwd, env={"SAMPLE_RECORD_DIR": str(record)})
            assert result.returncode == 0, f"train.py {' '.join(full)}\n{result.stderr[-4000:]}"
            shards = [json.loads(p.read_text()) for p in sorted(record.glob("shard*.json"))]
            initial, weights = (torch.load(record / name, weights_only=True) for name in ("initial.pt", "weights.pt"))
            self.cache[key] = Run(cwd, result.stdout, result.stderr, initial, weights, shards)
        return self.cache[key]
