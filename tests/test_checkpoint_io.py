"""Atomic, checksummed checkpoints: a damaged file is refused with exit 66 naming it, ``--ckpt_path last`` falls back
to the newest valid one, a failed save exits 73 naming the path, and a finished run is not trained again."""

import hashlib
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from checkpointing import CheckpointCorruptError, CheckpointWriteError, VerifiedCheckpointIO, newest_valid, verify
from tests.conftest import run_train

TIMEOUT_S = 120
CORRUPT = 66
CANT_CREATE = 73


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("train.py: error:")]


def flip_bytes(path: Path, offset: int, count: int = 16) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        data = handle.read(count)
        handle.seek(offset)
        handle.write(bytes(b ^ 0xFF for b in data))


# ------------------------------------------------------------------ the plug-in itself, in this process


def test_save_writes_the_file_and_a_sha256sum_sidecar_and_no_temporary_files(tmp_path):
    path = tmp_path / "ckpts" / "a.ckpt"
    VerifiedCheckpointIO().save_checkpoint({"w": torch.arange(10.0)}, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (tmp_path / "ckpts" / "a.ckpt.sha256").read_text() == f"{digest}  a.ckpt\n"  # sha256sum -c format
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.ckpt", "a.ckpt.sha256"]
    assert verify(path) == digest
    assert torch.equal(VerifiedCheckpointIO().load_checkpoint(path)["w"], torch.arange(10.0))
    VerifiedCheckpointIO().remove_checkpoint(path)
    assert list(path.parent.iterdir()) == []


def test_flipped_truncated_or_empty_files_are_refused_with_their_path(tmp_path):
    io = VerifiedCheckpointIO()
    for name, damage in [("flipped", lambda p: flip_bytes(p, p.stat().st_size // 2)),
                         ("truncated", lambda p: p.write_bytes(p.read_bytes()[:100])),
                         ("empty", lambda p: p.write_bytes(b""))]:
        path = tmp_path / f"{name}.ckpt"
        io.save_checkpoint({"w": torch.randn(1000)}, path)
        damage(path)
        with pytest.raises(CheckpointCorruptError, match=re.escape(str(path))):
            io.load_checkpoint(path)
    # Without a sidecar (plain Lightning wrote it), the zip archive's CRC32s still catch flipped tensor bytes.
    plain = tmp_path / "plain.ckpt"
    torch.save({"w": torch.randn(1000)}, plain)
    assert verify(plain) is None
    flip_bytes(plain, plain.stat().st_size // 2)
    with pytest.raises(CheckpointCorruptError, match="CRC|not a readable"):
        verify(plain)


def test_newest_valid_skips_damaged_newer_files(tmp_path):
    io = VerifiedCheckpointIO()
    old, new = tmp_path / "old.ckpt", tmp_path / "new.ckpt"
    io.save_checkpoint({"step": 1}, old)
    time.sleep(0.01)
    io.save_checkpoint({"step": 2}, new)
    assert newest_valid([old, new]) == (new, [])
    new.write_bytes(new.read_bytes()[:-10])
    chosen, rejected = newest_valid([old, new])
    assert chosen == old and [e.path for e in rejected] == [str(new)]


def test_a_failed_save_raises_naming_the_path_and_leaves_the_old_file(tmp_path):
    io = VerifiedCheckpointIO()
    path = tmp_path / "ok" / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    before = path.read_bytes()
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")  # fails as root too, unlike a read-only mode
    with pytest.raises(CheckpointWriteError, match=re.escape(str(blocker / "last.ckpt"))):
        io.save_checkpoint({"step": 2}, blocker / "last.ckpt")
    assert path.read_bytes() == before


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
    return tmp_path / "runs" / "fashion_mnist" / "checkpoints"


def test_every_checkpoint_has_a_matching_sidecar(trained):
    folder = trained / "runs" / "fashion_mnist" / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert "last.ckpt" in names and "last.ckpt.sha256" in names and len(names) == 4, names  # best and last
    for ckpt in folder.glob("*.ckpt"):
        assert verify(ckpt) is not None


def test_flipped_bytes_in_a_checkpoint_exit_66_with_its_path(trained, tmp_path, fashion_root):
    folder = copy_of(trained, tmp_path)
    last = folder / "last.ckpt"
    flip_bytes(last, last.stat().st_size // 2)  # inside the tensor payload: torch.load alone would accept it
    started = time.monotonic()
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "3", "--ckpt_path",
                        str(last)], cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.returncode == CORRUPT, result.stderr[-3000:]
    assert time.monotonic() - started < 60
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
    resumed = [int(n) for n in re.findall(r"^Epoch (\d+):", result.stdout, re.M)]
    assert resumed == list(range(best_epoch + 2, 4)), result.stdout  # trained on from the best epoch
    assert verify(last) is not None and torch.load(last, weights_only=False)["epoch"] == 2


def test_a_finished_run_relaunched_with_last_exits_0_without_training(trained, tmp_path, fashion_root):
    """What a requeued job that had already finished does: nothing, exit 0, before any rank starts."""
    copy_of(trained, tmp_path)
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "2", "--ckpt_path", "last"],
                       cwd=tmp_path, timeout=TIMEOUT_S)
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
    assert str(tmp_path / "runs" / "fashion_mnist" / "checkpoints") in errors[0]
    assert "Epoch 2" not in result.stdout
