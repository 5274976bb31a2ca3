"""One ``all_reduce`` per training batch (and per validation) for every callback that must decide with the other ranks.

The divergence guard (did any rank see a non-finite value?) and preemption (did any rank get a
signal?) must reach the same decision on every rank after every batch, or one rank would stop
while the others wait for it in their next collective. Each used to run its own ``all_reduce``
and read the result back to the host; together with Lightning's own per-batch SIGTERM broadcast
(switched off by callbacks/preemption.py) that was three collectives and three host syncs per
batch. Here every such callback derives from :class:`CollectiveCallback` and says what it
contributes (:meth:`CollectiveCallback.flags`); the first of them to ask for the agreed values
at a decision point gathers every participant's flags into one vector, runs one
``all_reduce(MAX)`` and one host read, and each callback reads its own slice.

Every rank must reach the same decision points with the same participants: the participants
register in ``setup`` (same callbacks, same order on every rank), and a participant contributes
at every point, zeros when it has nothing to say.
"""

import weakref
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer

TRAIN_BATCH = "train_batch_end"  # after every training batch (after the optimizer step)
VALIDATION = "validation_end"  # after every validation during fit


def all_max(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise MAX over all ranks, in place: one all_reduce (Lightning's ``strategy.reduce`` adds a barrier)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


class StepFlags:
    """The participants of one trainer, and the agreed values of the current decision point."""

    def __init__(self) -> None:
        self.participants: List["CollectiveCallback"] = []
        self._agreed: Optional[Dict[int, List[float]]] = None
        self.reductions = 0  # all_reduce calls so far (tests count them)

    def register(self, callback: "CollectiveCallback") -> None:
        if not any(p is callback for p in self.participants):
            self.participants.append(callback)
            self._agreed = None

    def clear(self) -> None:
        """A new decision point begins (a training batch or a validation starts)."""
        self._agreed = None

    def agreed(self, callback: "CollectiveCallback", trainer: Trainer, pl_module: LightningModule, point: str,
               outputs: Any = None) -> List[float]:
        """``callback``'s flags, MAX over all ranks; the first participant to ask at this point runs the collective.

        A participant not registered in ``setup`` (a hook called directly) joins here, which redoes the
        collective for this point, on every rank alike.
        """
        agreed = self._agreed
        if agreed is None or id(callback) not in agreed:
            self.register(callback)
            parts = [p.flags(trainer, pl_module, point, outputs) for p in self.participants]
            values = all_max(torch.cat(parts)).tolist()  # the one host sync of this point
            self.reductions += 1
            agreed, start = {}, 0
            for participant, part in zip(self.participants, parts):
                size = part.numel()
                agreed[id(participant)] = values[start:start + size]
                start += size
            self._agreed = agreed
        return agreed[id(callback)]


_per_trainer: "weakref.WeakKeyDictionary[Trainer, StepFlags]" = weakref.WeakKeyDictionary()


def step_flags(trainer: Trainer) -> StepFlags:
    """The :class:`StepFlags` of ``trainer`` (created on first use)."""
    if trainer not in _per_trainer:
        _per_trainer[trainer] = StepFlags()
    return _per_trainer[trainer]


class CollectiveCallback(Callback):
    """A callback whose decisions after each training batch and each validation are the same on every rank.

    Subclasses implement :meth:`flags` and call :meth:`agreed_flags` from ``on_train_batch_end`` /
    ``on_validation_end``; subclasses that override ``setup``, ``on_train_batch_start`` or
    ``on_validation_start`` call ``super()``.
    """

    def flags(self, trainer: Trainer, pl_module: LightningModule, point: str, outputs: Any) -> torch.Tensor:
        """What this rank contributes at ``point`` (``TRAIN_BATCH``: ``outputs`` is the training step's output;
        ``VALIDATION``): a 1-D float32 tensor on ``pl_module.device`` whose length depends only on ``point``;
        0 means nothing to report."""
        raise NotImplementedError

    def agreed_flags(self, trainer: Trainer, pl_module: LightningModule, point: str, outputs: Any = None) -> List[float]:
        """This callback's flags, element-wise MAX over all ranks (one collective shared by all participants)."""
        return step_flags(trainer).agreed(self, trainer, pl_module, point, outputs)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        step_flags(trainer).register(self)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        step_flags(trainer).clear()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        step_flags(trainer).clear()
