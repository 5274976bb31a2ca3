"""Random-number state in the checkpoint, so a resumed run draws the same dropout masks as an uninterrupted one.

Lightning 2.6 saves weights, optimizer, LR schedulers and loop counters, but not the state of
torch's, numpy's or Python's random generators; on resume ``seed_everything`` starts them again
from the seed. The data order does not suffer (the DistributedSampler's order is a function of
seed and epoch; mid-epoch, datamodules/resumable.py continues at the right batch), but every random
draw after the resume does: with the ``cnn`` (dropout), 2 epochs + 1 resumed epoch ended with weights
up to 0.07 away from 3 uninterrupted epochs. With this callback they are bitwise equal on CPU, resumed
at an epoch boundary or mid-epoch (tests/test_exact_resume.py).

The state saved is global rank 0's (Lightning saves callback state from rank 0); every rank is seeded
alike and draws alike, so it is every rank's under ddp (2 ranks with dropout resume bitwise). Stored
as tensors, ints and tuples only, so the checkpoint still loads with ``weights_only=True`` (LightningCLI
reads hyperparameters that way).
"""

import random
from typing import Any, Dict

import numpy as np
import torch
from lightning.pytorch import Callback


def capture() -> Dict[str, Any]:
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (str(kind), torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RngState(Callback):
    """Saves the generators' state with every checkpoint and restores it when training resumes (train.py adds it)."""

    def state_dict(self) -> Dict[str, Any]:
        return capture()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._pending = state_dict  # restored when the resumed epoch (or batch) starts, see below

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        """Resumed at an epoch boundary: put the state back where the uninterrupted run had it, then create the
        epoch's data iterator as that run did at this point.

        Creating a DataLoader iterator draws its base seed from torch's generator. An uninterrupted run
        does that after ``on_train_epoch_start`` of every epoch but the first; a resumed run did it once,
        before ``on_train_start``, with the state from the seed (Lightning's ``FitLoop.setup_data``) and skips
        it for the resumed epoch. Without this second ``iter`` the resumed run is one draw behind, and every
        dropout mask of the epoch differs. The samplers are lazy: nothing was fetched from the first iterator.
        """
        if getattr(self, "_pending", None) is None:
            return
        restore(self._pending)
        self._pending = None
        # Lightning calls on_train_epoch_start on a resume only at an epoch boundary (not mid-epoch).
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if trainer.current_epoch > 0 and fetcher is not None:
            iter(fetcher)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        """Resumed mid-epoch (a preemption checkpoint; Lightning then skips ``on_train_epoch_start``): restore here."""
        if getattr(self, "_pending", None) is not None:
            restore(self._pending)
            self._pending = None
