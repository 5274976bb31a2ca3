"""Atomic, checksummed checkpoints that load without running code: the sidecar format, damaged and crafted files
refused with their path (exit 66), the newest valid file chosen, a failed save naming its path."""

import hashlib
import os
import re
import time
from pathlib import Path

import pytest
import torch

from fashion_mnist_dp.cli import app as train
from fashion_mnist_dp.runtime.checkpoint_io import VerifiedCheckpointIO, load, newest_valid, verify
from fashion_mnist_dp.runtime.errors import CheckpointError, CantWriteError


def flip_bytes(path: Path, offset: int, count: int = 16) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        data = handle.read(count)
        handle.seek(offset)
        handle.write(bytes(b ^ 0xFF for b in data))


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
        with pytest.raises(CheckpointError, match=re.escape(str(path))):
            io.load_checkpoint(path)
    # Without a sidecar (plain Lightning wrote it), the zip archive's CRC32s still catch flipped tensor bytes.
    plain = tmp_path / "plain.ckpt"
    torch.save({"w": torch.randn(1000)}, plain)
    assert verify(plain) is None
    flip_bytes(plain, plain.stat().st_size // 2)
    with pytest.raises(CheckpointError, match="CRC|not a readable"):
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
    with pytest.raises(CantWriteError, match=re.escape(str(blocker / "last.ckpt"))):
        io.save_checkpoint({"step": 2}, blocker / "last.ckpt")
    assert path.read_bytes() == before




class Payload:
    """Unpickled without ``weights_only``, this creates ``folder``: a stand-in for a checkpoint that runs code."""

    def __init__(self, folder):
        self.folder = str(folder)

    def __reduce__(self):
        return os.makedirs, (self.folder,)


def crafted(path: Path, ran: Path) -> Path:
    VerifiedCheckpointIO().save_checkpoint({"state_dict": {}, "global_step": 8, "payload": Payload(ran)}, path)
    return path  # with a matching sha256 sidecar: the checksum says nothing about what the file holds


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict"])
def test_a_checkpoint_that_would_run_code_is_refused_with_one_line_and_exit_66(capsys, workdir, fashion_root,
                                                                                subcommand):
    ran = workdir / "payload-ran"
    path = crafted(workdir / "crafted.ckpt", ran)
    with pytest.raises(CheckpointError, match="objects other than tensors and plain data"):
        load(path)
    code = train.main([subcommand, "--data_dir", str(fashion_root), "--ckpt_path", str(path)])
    err = capsys.readouterr().err
    assert code == 66 and err.count("\n") == 1 and "could run code when loaded" in err and str(path) in err, err
    assert not ran.exists()


def test_ckpt_path_last_never_runs_a_crafted_last_checkpoint(capsys, workdir, fashion_root):
    ran = workdir / "payload-ran"
    crafted(workdir / "runs" / "cnn-single-1x128-sgd" / "checkpoints" / "last.ckpt", ran)
    code = train.main(["--data_dir", str(fashion_root), "--ckpt_path", "last"])
    assert code == 66 and "could run code when loaded" in capsys.readouterr().err
    assert not ran.exists()


def test_ckpt_path_hpc_never_runs_a_crafted_hpc_checkpoint(capsys, workdir, fashion_root):
    """``hpc`` is resolved to default_root_dir's newest hpc_ckpt_N.ckpt before launch and checked like a file."""
    ran = workdir / "payload-ran"
    crafted(workdir / "runs" / "hpc_ckpt_10.ckpt", ran)
    crafted(workdir / "runs" / "hpc_ckpt_9.ckpt", ran)  # written last, and "9" > "10" as names: only N picks 10
    newer = time.time() + 60
    os.utime(workdir / "runs" / "hpc_ckpt_9.ckpt", (newer, newer))
    code = train.main(["--data_dir", str(fashion_root), "--ckpt_path", "hpc"])
    err = capsys.readouterr().err
    assert code == 66 and err.count("\n") == 1 and "could run code when loaded" in err, err
    assert str(workdir / "runs" / "hpc_ckpt_10.ckpt") in err, err
    assert not ran.exists()


def test_ckpt_path_hpc_without_an_hpc_checkpoint_is_one_line(capsys, workdir, fashion_root):
    code = train.main(["--data_dir", str(fashion_root), "--ckpt_path", "hpc"])
    err = capsys.readouterr().err
    assert code == 66 and err.count("\n") == 1, err
    assert f"--ckpt_path hpc: no hpc_ckpt_N.ckpt in {workdir / 'runs'}" in err, err
    code = train.main(["--data_dir", str(fashion_root), "--ckpt_path", "hpc", "--trainer.default_root_dir", ""])
    err = capsys.readouterr().err
    assert code == 66 and f"no hpc_ckpt_N.ckpt in {workdir} (" in err, err  # "": the Trainer's cwd, as Lightning
