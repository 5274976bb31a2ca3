"""The ranks' one agreement: what every rank must decide alike is decided at the same decision points, with one
all_gather and one host read; in between, participants note what they see in device tensors and read nothing back.
When the points come: docs/reliability.md, "The ranks' one agreement"."""

import math
from typing import List, Optional, Sequence

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.owner import each
from lightning_modules.classifier import LossWindow

TRAIN_STEP = "train_step"
VALIDATION = "validation_end"
EPOCH_END = "train_epoch_end"
BEFORE_SAVE = "before_save"
DEFAULT_CHECK_EVERY_N_STEPS = 50
POINTS = {TRAIN_STEP: "training step", VALIDATION: "validation end", EPOCH_END: "epoch end",
          BEFORE_SAVE: "before a checkpoint save"}


class Participant(Callback):
    """A callback that decides with the other ranks: it contributes a fixed-length vector at every decision point and
    acts on every rank's vector. It must come before the :class:`Agreement` in ``trainer.callbacks``."""

    def contribute(self, trainer: Trainer, pl_module: LightningModule, point: str) -> torch.Tensor:
        """A 1-D float32 tensor on ``pl_module.device``, of the same length at every point (0: nothing to report)."""
        raise NotImplementedError

    def decide(self, trainer: Trainer, pl_module: LightningModule, point: str, rows: List[List[float]]) -> None:
        """Act on what every rank contributed (one row per rank, in rank order); raise to stop the run."""
        raise NotImplementedError


class Agreement(Callback):
    """Runs the decision points for the :class:`Participant` callbacks listed before its owner (or it) in
    ``trainer.callbacks`` and its owner's own (``owned``), in that order (the first to raise wins)."""

    def __init__(self, check_every_n_steps: int = DEFAULT_CHECK_EVERY_N_STEPS):
        if check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.every = check_every_n_steps
        self.participants: List[Participant] = []
        self.decisions = 0  # points decided so far (tests count them)
        self._trained_since = False
        self._decided_step = -1
        self.last_point: Optional[str] = None  # the last point every rank passed (the hang report names it)
        self.owned: List[Callback] = []  # its owner's parts before it (fashion_mnist_dp/runtime/safety.py)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_order(trainer.callbacks)
        listed = [c for c in trainer.callbacks if isinstance(c, Participant)]
        self.participants = [*listed, *(c for c in self.owned if isinstance(c, Participant) and c not in listed)]

    def decide(self, trainer: Trainer, pl_module: LightningModule, point: str) -> None:
        """One decision point: every rank must call it with the same ``point``."""
        self._trained_since = False
        self._decided_step = trainer.global_step
        parts = [p.contribute(trainer, pl_module, point) for p in self.participants]
        vector = torch.cat(parts).float()  # one collective and the one host read of this point:
        rows = trainer.strategy.all_gather(vector).reshape(-1, vector.numel()).tolist()
        self.decisions += 1
        self.last_point = f"optimizer step {trainer.global_step} ({POINTS[point]})"
        start = 0
        for participant, part in zip(self.participants, parts):
            participant.decide(trainer, pl_module, point, [row[start:start + part.numel()] for row in rows])
            start += part.numel()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._decided_step = trainer.global_step  # a resumed run starts on a step that was decided before

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        self._trained_since = True
        step = trainer.global_step
        if step % self.every == 0 and step != self._decided_step:  # just stepped onto a multiple of n
            self.decide(trainer, pl_module, TRAIN_STEP)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.decide(trainer, pl_module, VALIDATION)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.decide(trainer, pl_module, EPOCH_END)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        """Every rank takes part in every save during fit (Lightning's ``dump_checkpoint``). Not while an exception
        is handled: a rank may be gone, and a collective would wait for it."""
        if self._trained_since and trainer.state.fn == "fit" and not trainer.interrupted:
            self.decide(trainer, pl_module, BEFORE_SAVE)


def check_order(callbacks: Sequence[Callback]) -> None:
    """Raise when ``callbacks`` break an order that exists for a reason: every participant before the Agreement (it
    reads what they noted for the batch), DivergenceGuard before Preemption (a diverged run stops without the
    checkpoint a signal would write), JobFaults before both (its ``on_exception`` runs first: no collective save with
    a rank that is gone). Lightning itself puts the checkpoint callbacks last, after every decision."""
    callbacks = list(each(callbacks))  # an owner's parts after it, in their order
    names = [type(c).__name__ for c in callbacks]
    agreement = next((i for i, c in enumerate(callbacks) if isinstance(c, Agreement)), len(callbacks))
    late = [type(c).__name__ for c in callbacks[agreement:] if isinstance(c, Participant)]
    if late:
        raise MisconfigurationException(f"{', '.join(late)} must come before Agreement in trainer.callbacks "
                                         "(configs/default.yaml lists the order)")
    for first, then in (("JobFaults", "DivergenceGuard"), ("JobFaults", "Preemption"),
                        ("DivergenceGuard", "Preemption")):
        if first in names and then in names and names.index(first) > names.index(then):
            raise MisconfigurationException(f"{first} must come before {then} in trainer.callbacks "
                                            "(configs/default.yaml lists the order)")


class TrainingLoss(Participant):
    """The training loss averaged over the steps since the last decision point and over every rank: on the host at
    each point, at no read of its own (the progress bar shows it); ``latest`` is None before the first point."""

    def __init__(self) -> None:
        self.latest: Optional[float] = None
        self._window = LossWindow()  # since the last point

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs  # Lightning's detached copy
        if torch.is_tensor(loss):
            self._window.add(loss.float())

    def contribute(self, trainer: Trainer, pl_module: LightningModule, point: str) -> torch.Tensor:
        if not self._window.count:
            return torch.full((1,), math.nan, device=pl_module.device)
        return self._window.mean().reshape(1).to(pl_module.device)

    def decide(self, trainer: Trainer, pl_module: LightningModule, point: str, rows: List[List[float]]) -> None:
        means = [row[0] for row in rows if not math.isnan(row[0])]
        if means:
            self.latest = sum(means) / len(means)
        self._window = LossWindow()
