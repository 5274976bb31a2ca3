"""The data loader's workers: ``worker_init_fn`` by import path (hyperparameters and checkpoints hold no code), and
run once in real workers, so a function that fails there (or a temp folder they cannot use) is one line before
training, not every worker's traceback at a first batch."""

import importlib
import os
import tempfile
from typing import Callable, Optional

import torch.multiprocessing
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader


def imported(path: str, argument: str):
    """The callable an import path names (``package.module.function``), or ValueError saying why not."""
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{argument} {path!r} cannot be imported: {error}") from error
    if not callable(found):
        raise ValueError(f"{argument} {path!r} is not an import path of a function (package.module.function)")
    return found


SOCKET_PATH_BYTES = 107  # a Unix socket's path (sun_path: 108 bytes, with its NUL)


def check_temp_folder() -> None:
    """A worker hands each batch over a Unix socket in multiprocessing's folder under the temp folder (torch's
    ``file_descriptor`` sharing): past 107 bytes it cannot bind one, and its rank waits out the worker timeout."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    folder = tempfile.gettempdir()
    longest = SOCKET_PATH_BYTES - len("/pymp-12345678/listener-12345678")  # multiprocessing's names under it
    if len(os.fsencode(folder)) > longest:
        raise MisconfigurationException(
            f"data loader workers cannot use the temp folder {folder} ({len(os.fsencode(folder))} bytes): their "
            f"sockets go there, and a Unix socket's path holds {SOCKET_PATH_BYTES} bytes; set TMPDIR to a folder of "
            f"at most {longest} bytes (e.g. /tmp), or --data.num_workers 0")


def check_workers(workers: int, init_fn: Optional[Callable[[int], object]], path: str,
                  timeout: Optional[float]) -> None:
    """With ``workers``: the temp folder, then ``init_fn`` in that many DataLoader workers, as training starts them;
    MisconfigurationException naming ``path`` and the worker's own error if it raises there (or the workers time out
    after ``timeout`` s)."""
    if not workers:
        return
    check_temp_folder()
    if init_fn is None:
        return
    try:
        for _ in DataLoader(range(workers), num_workers=workers, timeout=timeout or 0, worker_init_fn=init_fn):
            pass
    except Exception as error:  # torch re-raises the worker's: "Caught TypeError in DataLoader worker process 0..."
        raised = str(error).strip().splitlines()[-1]  # the worker's own exception line
        raise MisconfigurationException(
            f"data.worker_init_fn {path} fails in a data loader worker ({raised}): give the import path of a function "
            f"that takes the worker's id, or --data.num_workers 0") from error
