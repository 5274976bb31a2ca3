"""Checkpoints written atomically with a sha256 sidecar, verified before loading, loaded without running code
(``weights_only=True``); remote paths are Lightning's: docs/reliability.md, "Checkpoints"."""

import contextlib
import hashlib
import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from fashion_mnist_dp.runtime.errors import CheckpointError, CantWriteError

SUFFIX = ".sha256"


def sidecar_path(path) -> Path:
    return Path(f"{path}{SUFFIX}")


def is_remote(path) -> bool:
    return "://" in str(path)


def _stamp(path) -> Tuple[int, int]:
    stat = Path(path).stat()
    return stat.st_mtime_ns, stat.st_size


_VERIFIED: Dict[tuple, str] = {}  # (path, its stamp, the sidecar's sha256) -> the file's: an unchanged file read once


def file_sha256(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def verify(path) -> Optional[str]:
    """The sha256 when it matches the sidecar; None without one when the zip archive is sound; else raises."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointError.damaged(path, "the file is empty")
    sidecar = sidecar_path(path)
    if sidecar.is_file():
        words = sidecar.read_text(errors="replace").split()
        expected = words[0].lower() if words else ""
        key = (str(path.absolute()), _stamp(path), expected)
        actual = _VERIFIED.get(key) or file_sha256(path)
        if actual != expected:
            raise CheckpointError.damaged(path, f"sha256 {actual[:12]}... does not match {sidecar.name} "
                                          f"({expected[:12]}...): truncated or changed after it was written")
        _VERIFIED[key] = actual
        return actual
    try:  # no sidecar (e.g. written by plain Lightning): torch.save's zip archive carries a CRC32 per member
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CheckpointError.damaged(path, f"not a readable checkpoint archive ({error}); no {SUFFIX} file") from error
    if bad is not None:
        raise CheckpointError.damaged(path, f"CRC error in {bad}; no {SUFFIX} file")
    return None


def load(path, map_location: Any = "cpu") -> dict:
    """A verified checkpoint, unpickled with ``weights_only=True`` (tensors and plain data only, no code)."""
    verify(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError.damaged(
            path, "it holds objects other than tensors and plain data, which could run code when loaded, so it was "
                  f"not loaded ({' '.join(str(error).split()[:12])}...); use a checkpoint written by this project"
        ) from error
    except (RuntimeError, EOFError, KeyError, zipfile.BadZipFile) as error:
        raise CheckpointError.damaged(path, f"torch.load failed: {' '.join(str(error).split())[:200]}") from error


def newest_valid(candidates: Iterable[Path]) -> Tuple[Optional[Path], List[CheckpointError]]:
    """The newest (mtime) candidate that passes :func:`verify`, and the damaged ones seen before it."""
    rejected: List[CheckpointError] = []
    existing = [Path(p) for p in candidates if Path(p).is_file()]
    for path in sorted(existing, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        try:
            verify(path)
            return path, rejected
        except CheckpointError as error:
            rejected.append(error)
    return None, rejected


def _write_synced(path: Path, data) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems do not support fsync on a folder
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Atomic, checksummed saves; verified, code-free loads. configs/default.yaml gives it as trainer.plugins."""

    _handed: Optional[Tuple[str, Tuple[int, int], dict]] = None

    def hand_over(self, path, checkpoint: dict) -> None:
        """``checkpoint``, already read and verified from ``path`` (the CLI's parse), is what the next load of that
        unchanged file returns: one read of the file for the whole run."""
        self._handed = (str(path), _stamp(path), checkpoint)

    def save_checkpoint(self, checkpoint: dict, path, storage_options: Optional[Any] = None) -> None:
        if is_remote(path) or storage_options is not None:  # Lightning's TypeError for storage_options
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getbuffer()
        digest = hashlib.sha256(data).hexdigest()
        sidecar = sidecar_path(path)
        tmp, sidecar_tmp = (path.with_name(f".{p.name}.tmp-{os.getpid()}") for p in (path, sidecar))
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
                with contextlib.suppress(OSError):
                    leftover.unlink()
            reason = error.strerror or type(error).__name__
            if error.filename and str(error.filename) not in (str(path), str(tmp), str(sidecar), str(sidecar_tmp)):
                reason += f": {error.filename}"
            failure = CantWriteError(f"cannot write checkpoint {path}: {reason}")
            failure.errno = error.errno
            raise failure from error
        if written != digest:
            raise CantWriteError(f"checkpoint {path} reads back with another sha256 than was written")

    def load_checkpoint(self, path, map_location: Optional[Callable] = lambda storage, loc: storage,
                        weights_only: Optional[bool] = None) -> dict:
        if is_remote(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        handed, self._handed = self._handed, None
        if handed is not None and handed[0] == str(path) and handed[1] == _stamp(path):
            return handed[2]  # read on the CPU, as Lightning's map_location keeps it
        return load(path, map_location)

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        if not is_remote(path):
            sidecar_path(path).unlink(missing_ok=True)
