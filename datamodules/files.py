"""The four Fashion-MNIST IDX files: where they are, their download, and a check before anything trains on them.

torchvision checks the downloaded archives' MD5 only; a truncated, gzipped or mislabelled IDX file fails later with
a message that names neither file nor problem, or trains silently on fewer images (docs/reliability.md). Here each
file's header, size and labels are checked; a problem raises :class:`CorruptDataError` naming the file (exit 65)."""

import math
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

from torchvision.datasets import FashionMNIST


class DataNotFoundError(FileNotFoundError):
    """The IDX files are missing and could not be downloaded (train.py: exit 65)."""


class CorruptDataError(ValueError):
    """An IDX file is unreadable, truncated, of the wrong kind, or disagrees with its pair (train.py: exit 65)."""


DATA_DIR_ENV = "FASHION_MNIST_DIR"
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def default_data_dir() -> str:
    """``$FASHION_MNIST_DIR`` if set, else ``./data``."""
    return os.environ.get(DATA_DIR_ENV) or "data"


def torchvision_root(data_dir: str) -> Path:
    """The folder torchvision expects (it holds ``FashionMNIST/raw``), also when given that folder or ``raw`` itself."""
    path = Path(data_dir).expanduser()
    if path.name == "raw" and path.parent.name == FashionMNIST.__name__:
        return path.parent.parent
    if path.name == FashionMNIST.__name__:
        return path.parent
    return path


def raw_folder(data_dir: str) -> Path:
    return torchvision_root(data_dir) / FashionMNIST.__name__ / "raw"


def missing_files(data_dir: str) -> List[str]:
    # os.path.isfile, not Path.is_file: a folder we may not enter counts as missing instead of raising.
    return [name for name in RAW_FILES if not os.path.isfile(raw_folder(data_dir) / name)]


def _unreadable_folder(data_dir: str) -> Optional[Path]:
    """The first folder from data_dir down to ``raw`` that exists but cannot be listed or entered."""
    root = torchvision_root(data_dir)
    for path in (root, root / FashionMNIST.__name__, raw_folder(data_dir)):
        if os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):
            return path
    return None


def download(data_dir: str, mirror: Optional[str] = None) -> None:
    """torchvision's download (``mirror`` first, then its own) into a private folder beside ``raw``, since torchvision
    writes and extracts in place; the files checked there, then each hard-linked into ``raw``. A link is atomic, on
    NFS too, and never replaces a file: nodes that download into one shared folder at once leave the first checked
    copy of each file, and no reader sees a half-written one. ``.gz`` archives already in ``raw`` are used."""
    raw = raw_folder(data_dir)
    raw.mkdir(parents=True, exist_ok=True)
    mirrors = [mirror.rstrip("/") + "/"] if mirror else []
    dataset = type(FashionMNIST.__name__, (FashionMNIST,), {"mirrors": mirrors + FashionMNIST.mirrors})
    with tempfile.TemporaryDirectory(prefix=".download-", dir=raw.parent) as private:
        fetched = Path(private) / FashionMNIST.__name__ / "raw"
        fetched.mkdir(parents=True)
        for archive in (raw / name for name, _ in FashionMNIST.resources if (raw / name).is_file()):
            shutil.copy(archive, fetched)  # torchvision checks its MD5 and fetches it again if it differs
        dataset(private, train=False, download=True)
        check_raw_folder(fetched)
        for name in RAW_FILES:
            try:
                os.link(fetched / name, raw / name)
            except FileExistsError:  # another node's checked copy came first, or the file was never missing
                pass
            except OSError:  # a file system without hard links: a rename, atomic too, if still missing
                if not os.path.exists(raw / name):
                    os.replace(fetched / name, raw / name)


def download_or_raise(data_dir: str, missing: List[str], allowed: bool, mirror: Optional[str] = None) -> None:
    """:func:`download`, or :class:`DataNotFoundError` saying where the files go and why not."""
    unreadable = _unreadable_folder(data_dir)
    if unreadable is not None:
        raise DataNotFoundError(
            f"cannot read the folder {unreadable.resolve()} (permission denied): make it readable "
            f"(chmod a+rX) or point --data.data_dir or ${DATA_DIR_ENV} at a readable copy of FashionMNIST/raw.")
    reason = "download is disabled (--data.download false)"
    if allowed:
        try:
            download(data_dir, mirror)
            return
        except Exception as error:  # torchvision raises RuntimeError/URLError/OSError per mirror
            reason = f"download failed ({type(error).__name__}: {' '.join(str(error).split())[:200]})"
    raise DataNotFoundError(
        f"Fashion-MNIST not found in {raw_folder(data_dir).resolve()}: missing {', '.join(missing)} and {reason}. "
        f"Put the four IDX files ({', '.join(RAW_FILES)}) there, or point --data.data_dir "
        f"or ${DATA_DIR_ENV} at a folder that holds FashionMNIST/raw.")

UNSIGNED_BYTE = 0x08
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
GZIP_MAGIC = b"\x1f\x8b"
# The (images, labels) file pairs torchvision's FashionMNIST reads from FashionMNIST/raw.
SPLITS = (RAW_FILES[:2], RAW_FILES[2:])
REPAIR_HINT = "replace it with a good copy (or delete it and rerun with network to download it again)"


def _fail(path: Path, problem: str, hint: str = REPAIR_HINT) -> CorruptDataError:
    return CorruptDataError(f"{path}: {problem}; {hint}")


def read_header(path: Path, ndim: int) -> Tuple[int, ...]:
    """The dimensions in an IDX header of unsigned bytes with ``ndim`` dimensions; checks the file's size against
    them."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            header = f.read(4 + 4 * ndim)
    except OSError as error:
        raise _fail(path, f"cannot be read ({error.strerror or error})", "make it readable (chmod a+r)") from error
    if size == 0:
        raise _fail(path, "is empty (0 bytes)")
    if header[:2] == GZIP_MAGIC:
        raise _fail(path, "is still gzip-compressed (starts with 1f 8b): gunzip it")
    if len(header) < 4 + 4 * ndim:
        raise _fail(path, f"is {size} bytes, shorter than its {4 + 4 * ndim}-byte header")
    magic = struct.unpack(">I", header[:4])[0]
    expected_magic = (UNSIGNED_BYTE << 8) | ndim
    if magic != expected_magic:
        raise _fail(
            path,
            f"bad magic number 0x{magic:08x}, expected 0x{expected_magic:08x} (unsigned bytes, {ndim} dimension(s))",
        )
    dims = struct.unpack(f">{ndim}I", header[4:])
    expected_size = 4 + 4 * ndim + math.prod(dims)
    if size != expected_size:
        shape = "×".join(str(d) for d in dims)
        kind = "truncated" if size < expected_size else "has trailing bytes"
        raise _fail(path, f"{kind}: {size} bytes, expected {expected_size} ({4 + 4 * ndim}-byte header + {shape})")
    return dims


def check_split(images_path: Path, labels_path: Path) -> int:
    """Checks one images/labels pair; returns the number of samples."""
    count, *shape = read_header(images_path, 3)
    if tuple(shape) != IMAGE_SHAPE:
        raise _fail(images_path, f"images are {shape[0]}×{shape[1]} pixels, expected 28×28")
    if count == 0:
        raise _fail(images_path, "holds no images")
    (labels,) = read_header(labels_path, 1)
    if labels != count:
        raise _fail(labels_path, f"holds {labels} labels but {images_path.name} holds {count} images")
    values = labels_path.read_bytes()[8:]  # after the labels file's 8-byte header
    if max(values) >= NUM_CLASSES:
        index = next(i for i, value in enumerate(values) if value >= NUM_CLASSES)
        raise _fail(labels_path, f"label {values[index]} at index {index} is outside 0..{NUM_CLASSES - 1}")
    return count


def check_raw_folder(raw_folder: Path) -> None:
    """Checks both splits' files in ``raw_folder`` (they must exist); raises :class:`CorruptDataError`."""
    for images, labels in SPLITS:
        check_split(raw_folder / images, raw_folder / labels)
