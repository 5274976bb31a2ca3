"""``--strategy dp`` through the real process on a machine without CUDA: one line, exit 2, nothing written (the rest
of dp's tests are in-process: tests/unit/test_dp.py)."""

import pytest
import torch

from fashion_mnist_dp.strategies.dp import NO_GPU_MESSAGE
from tests.conftest import run_train

CUDA = torch.cuda.is_available()


def non_seed_lines(stderr):
    # Lightning's seed_everything logs "Seed set to 42" to stderr before the Trainer is built (every error path).
    return [line for line in stderr.splitlines() if line and not line.startswith("Seed set to")]


@pytest.mark.skipif(CUDA, reason="the no-GPU error")
def test_cli_without_gpu_exits_2_with_one_line_and_writes_nothing(workdir, fashion_root):
    result = run_train(["--strategy", "dp", "--data_dir", str(fashion_root)], cwd=workdir)
    assert result.returncode == 2
    (line,) = non_seed_lines(result.stderr)
    assert line.startswith(f"train.py: error: {NO_GPU_MESSAGE}")
    assert "dp" in line and "--strategy ddp" in line
    assert not (workdir / "runs").exists() and not (workdir / "lightning_logs").exists()


