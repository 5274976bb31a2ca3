"""Atomic, checksummed checkpoints: a damaged file is refused with exit 66 naming it, ``--ckpt_path last`` falls back
to the newest valid one, a failed save exits 73 naming the path, and a finished run is not trained again."""

import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.epoch_lines import parse_epoch_lines
from fashion_mnist_dp.runtime.checkpoint_io import verify
from tests.conftest import experiment_dir, run_dir, run_train
from tests.unit.test_checkpoint_io import flip_bytes

TIMEOUT_S = 120
CORRUPT = 66
CANT_CREATE = 73


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("train.py: error:")]




# ------------------------------------------------------------------ the plug-in itself, in this process










# ------------------------------------------------------------------ through the real CLI


@pytest.fixture(scope="module")
def trained(tmp_path_factory, fashion_root):
    """One 2-epoch run (mlp, 8 steps per epoch); tests copy its folder before damaging anything."""
    folder = tmp_path_factory.mktemp("trained")
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--batch_size", "32", "--epochs", "2",
                        "--test_after_fit", "false"], cwd=folder, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def copy_of(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained / "runs", tmp_path / "runs")
    return run_dir(tmp_path) / "checkpoints"


def test_every_checkpoint_has_a_matching_sidecar(trained):
    folder = run_dir(trained) / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert "last.ckpt" in names and "last.ckpt.sha256" in names and len(names) == 4, names  # best and last
    for ckpt in folder.glob("*.ckpt"):
        assert verify(ckpt) is not None


def test_flipped_bytes_in_a_checkpoint_exit_66_with_its_path(trained, tmp_path, fashion_root):
    folder = copy_of(trained, tmp_path)
    last = folder / "last.ckpt"
    flip_bytes(last, last.stat().st_size // 2)  # inside the tensor payload: torch.load alone would accept it
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "3", "--ckpt_path",
                        str(last)], cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.returncode == CORRUPT, result.stderr[-3000:]
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and str(last) in errors[0] and "sha256" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Epoch" not in result.stdout


def test_a_truncated_newest_last_falls_back_to_the_newest_valid_checkpoint_with_a_warning(trained, tmp_path,
                                                                                            fashion_root):
    folder = copy_of(trained, tmp_path)
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    (best,) = folder.glob("best-*.ckpt")
    best_epoch = torch.load(best, weights_only=False)["epoch"]
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--batch_size", "32", "--epochs", "3",
                        "--ckpt_path", "last", "--test_after_fit", "false"], cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("train.py: warning:")]
    assert len(warnings) == 2, result.stderr[-3000:]
    assert str(last) in warnings[0] and "damaged" in warnings[0]
    assert f"resumes from {best}" in warnings[1]
    resumed = [line.epoch for line in parse_epoch_lines(result.stdout)]
    assert resumed == list(range(best_epoch + 2, 4)), result.stdout  # trained on from the best epoch
    assert verify(last) is not None and torch.load(last, weights_only=False)["epoch"] == 2


def test_a_finished_run_relaunched_with_last_exits_0_without_training(trained, tmp_path, fashion_root):
    """What a requeued job that had already finished does: nothing, exit 0, before any rank starts."""
    copy_of(trained, tmp_path)
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--batch_size", "32", "--epochs", "2",
                        "--ckpt_path", "last"], cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^train\.py: .*last\.ckpt has finished training: 2 epoch\(s\) trained, --epochs 2",
                     result.stdout, re.M), result.stdout
    assert "Epoch" not in result.stdout and "Restored" not in result.stderr


def test_a_failed_save_exits_73_naming_the_path(tmp_path, fashion_root):
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--batch_size", "32", "--epochs", "2",
                        "--test_after_fit", "false", "--trainer.callbacks+=tests.recorder.BreakCheckpointFolder",
                        "--trainer.callbacks.epoch=1"], cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.returncode == CANT_CREATE, result.stderr[-3000:]
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "cannot write checkpoint" in errors[0], result.stderr[-3000:]
    assert str(run_dir(tmp_path) / "checkpoints") in errors[0]
    assert "Epoch 2" not in result.stdout
