"""A disk that fills at one chosen write (tests/test_full_disk.py): imported at start-up when this folder is on
PYTHONPATH. Every file opened for writing under $FULL_DISK_ROOT is counted and its path appended to $FULL_DISK_LOG;
from the $FULL_DISK_AT-th on (from 1), each raises ENOSPC at its first write or flush, as a full disk does (the
file exists, empty).
"""

import builtins
import errno
import os

_ROOT, _AT, _LOG = os.environ.get("FULL_DISK_ROOT"), int(os.environ.get("FULL_DISK_AT", "0")), os.environ.get(
    "FULL_DISK_LOG")
_open, _count = builtins.open, [0]


class _Full:
    """The file as opened, whose writes fail with ENOSPC."""

    def __init__(self, handle, path):
        self._handle, self._path = handle, path

    def _fail(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)

    write = writelines = flush = _fail

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()

    def __iter__(self):
        return iter(self._handle)


def _counted_open(file, mode="r", *args, **kwargs):
    handle = _open(file, mode, *args, **kwargs)
    if _ROOT and isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
        path = os.path.abspath(os.fspath(file))
        if path.startswith(_ROOT) and path != _LOG:
            _count[0] += 1
            if _LOG:
                with _open(_LOG, "a") as log:
                    log.write(f"{os.getpid()} {_count[0]} {path}\n")
            if _AT and _count[0] >= _AT:
                return _Full(handle, path)
    return handle


if _ROOT:
    builtins.open = _counted_open
