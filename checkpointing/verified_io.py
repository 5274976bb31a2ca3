"""A CheckpointIO that writes atomically with a sha256 sidecar, and verifies before loading.

Lightning 2.6.6 writes checkpoints with ``_atomic_save``, which swallows a ``PermissionError``
(no file, no error: Lightning issue #21800), and ``torch.load`` accepts a file whose tensor bytes
were flipped. Here a save of ``X.ckpt``:

1. serialises the checkpoint in memory and takes its sha256;
2. writes ``.X.ckpt.tmp-<pid>`` and ``.X.ckpt.sha256.tmp-<pid>`` in the same folder, each fsync'ed;
3. renames the checkpoint over ``X.ckpt``, then the sidecar over ``X.ckpt.sha256``
   (``sha256sum`` format: ``sha256sum -c X.ckpt.sha256`` checks it), and fsyncs the folder;
4. reads ``X.ckpt`` back and compares its sha256.

Any OSError (read-only folder, no space, permission) raises :class:`CheckpointWriteError` naming the
path: train.py exits 73. A reader therefore sees the old or the new file, never a partial one; a
crash between the two renames leaves a new checkpoint beside the old sidecar, which reads as
damaged, and ``--ckpt_path last`` falls back (train.py). Before loading, :func:`verify` compares the
sha256 with the sidecar; a file without a sidecar (written by plain Lightning) is checked as a zip
archive instead (every member's CRC32). A damaged file raises :class:`CheckpointCorruptError`: exit 66.

Remote (``s3://``...) paths are left to Lightning's own CheckpointIO: no rename there.
"""

import hashlib
import io
import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

SUFFIX = ".sha256"
CHUNK = 1 << 20


class CheckpointCorruptError(ValueError):
    """A checkpoint is truncated, damaged, or does not match its sha256; ``path`` names it."""

    def __init__(self, path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is damaged: {reason}")
        self.path = str(path)
        self.reason = reason


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; nothing was replaced."""


def sidecar_path(path) -> Path:
    return Path(f"{path}{SUFFIX}")


def _is_remote(path) -> bool:
    return "://" in str(path)


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _expected(path) -> Optional[str]:
    sidecar = sidecar_path(path)
    if not sidecar.is_file():
        return None
    text = sidecar.read_text(errors="replace").split()
    return text[0].lower() if text else ""


def verify(path) -> Optional[str]:
    """The checkpoint's sha256 when it matches its sidecar; None when it has no sidecar but is a sound zip archive.

    Raises :class:`CheckpointCorruptError` (with the reason) otherwise, FileNotFoundError when it is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointCorruptError(path, "the file is empty")
    expected = _expected(path)
    if expected is not None:
        actual = file_sha256(path)
        if actual != expected:
            raise CheckpointCorruptError(
                path, f"sha256 {actual[:12]}... does not match {sidecar_path(path).name} ({expected[:12]}...): "
                      f"truncated or changed after it was written")
        return actual
    # No sidecar (e.g. written by plain Lightning): torch.save's zip archive carries a CRC32 per member.
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CheckpointCorruptError(path, f"not a readable checkpoint archive ({error}); no {SUFFIX} file") from error
    if bad is not None:
        raise CheckpointCorruptError(path, f"CRC error in {bad}; no {SUFFIX} file")
    return None


def newest_valid(candidates: Iterable[Path]) -> Tuple[Optional[Path], List[CheckpointCorruptError]]:
    """The most recently written (mtime) candidate that passes :func:`verify`, and the damaged ones seen before it."""
    rejected: List[CheckpointCorruptError] = []
    existing = [Path(p) for p in candidates if Path(p).is_file()]
    for path in sorted(existing, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        try:
            verify(path)
            return path, rejected
        except CheckpointCorruptError as error:
            rejected.append(error)
    return None, rejected


def _write_synced(path: Path, data) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems do not support fsync on a folder
    finally:
        os.close(descriptor)


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Atomic, checksummed saves; verified loads. train.py installs it on every strategy."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options: Optional[Any] = None) -> None:
        if _is_remote(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getbuffer()
        digest = hashlib.sha256(data).hexdigest()
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        sidecar = sidecar_path(path)
        sidecar_tmp = path.with_name(f".{sidecar.name}.tmp-{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_synced(tmp, data)
            _write_synced(sidecar_tmp, f"{digest}  {path.name}\n".encode())
            os.replace(tmp, path)
            os.replace(sidecar_tmp, sidecar)
            _fsync_dir(path.parent)
            written = file_sha256(path)
        except OSError as error:
            for leftover in (tmp, sidecar_tmp):
                try:
                    leftover.unlink()
                except OSError:
                    pass
            reason = error.strerror or type(error).__name__
            if error.filename and str(error.filename) not in (str(path), str(tmp), str(sidecar), str(sidecar_tmp)):
                reason += f": {error.filename}"
            failure = CheckpointWriteError(f"cannot write checkpoint {path}: {reason}")
            failure.errno = error.errno
            raise failure from error
        if written != digest:
            raise CheckpointWriteError(f"checkpoint {path} reads back with another sha256 than was written")

    def load_checkpoint(self, path, map_location: Optional[Callable] = lambda storage, loc: storage,
                        weights_only: Optional[bool] = None) -> dict:
        if not _is_remote(path):
            verify(path)
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except (RuntimeError, EOFError, KeyError, zipfile.BadZipFile) as error:
            if _is_remote(path):
                raise
            raise CheckpointCorruptError(path, f"torch.load failed: {' '.join(str(error).split())[:200]}") from error

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        if not _is_remote(path):
            try:
                sidecar_path(path).unlink()
            except FileNotFoundError:
                pass
