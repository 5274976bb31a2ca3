"""Shared fixtures: tiny IDX data in a temporary folder, and a clean working directory per test."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.idx_files import write_fashion_mnist

REPO = Path(__file__).resolve().parents[1]
TRAIN_PY = REPO / "train.py"


@pytest.fixture(scope="session")
def fashion_root(tmp_path_factory) -> Path:
    """A folder holding FashionMNIST/raw with 256 training and 101 test images (odd on purpose)."""
    return write_fashion_mnist(tmp_path_factory.mktemp("data"))


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """Run in an empty folder, so runs/ and checkpoints land in tmp_path; no data dir from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FASHION_MNIST_DIR", raising=False)
    return tmp_path


def run_train(args, cwd: Path, timeout: float = 240, env=None) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` as a user runs it, in ``cwd``, with a hard timeout."""
    full_env = {k: v for k, v in os.environ.items() if k != "FASHION_MNIST_DIR"}
    full_env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, **(env or {}))
    return subprocess.run(
        [sys.executable, str(TRAIN_PY), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def strategy_runs(fashion_root, tmp_path_factory):
    """Short mlp runs (tests/strategy_runs.py), each started once per session however many tests read it."""
    from tests.strategy_runs import StrategyRuns

    return StrategyRuns(fashion_root, tmp_path_factory.mktemp("strategy_runs"))
