"""The data loader's workers: ``worker_init_fn`` by import path (hyperparameters and checkpoints hold no code), and
run once in real workers, so a function that fails there is one line before training, not every worker's
traceback at a first batch."""

import importlib
from typing import Callable, Optional

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


def run_in_workers(init_fn: Callable[[int], object], path: str, workers: int, timeout: Optional[float]) -> None:
    """``init_fn`` in ``workers`` DataLoader workers, as training starts them; MisconfigurationException naming
    ``path`` and the worker's own error if it raises there (or the workers time out after ``timeout`` s)."""
    batches = iter(DataLoader(range(workers), num_workers=workers, timeout=timeout or 0, worker_init_fn=init_fn))
    try:
        for _ in batches:
            pass
        return
    except Exception as error:  # torch re-raises the worker's: "Caught TypeError in DataLoader worker process 0..."
        raised = str(error).strip().splitlines()[-1]  # the worker's own exception line
        error.__traceback__ = None  # its frames hold the iterator in a reference cycle
    # The last reference: the iterator stops its workers now. Left to the garbage collector, its queues could close
    # first, and a worker that ignores SIGTERM (init_data_worker does) would keep the process from exiting.
    del batches
    raise MisconfigurationException(
        f"data.worker_init_fn {path} fails in a data loader worker ({raised}): give the import path of a function "
        f"that takes the worker's id, or --data.num_workers 0")
