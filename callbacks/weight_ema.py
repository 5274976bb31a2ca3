"""Evaluate and save an exponential moving average (EMA) of the weights, as airbench does: the average of the last
few hundred steps' weights generalises better than the last step's, at no extra forward pass.

Why not Lightning's ``EMAWeightAveraging``: it updates through torch's ``AveragedModel.update_parameters``, which
reads its update count from the device twice per update (``bool(self.n_averaged == 0)``: on a GPU the host waits
every step) and applies an EMA ``avg_fn`` one tensor at a time. Here the count is a Python int and one ``_foreach``
kernel updates every tensor. Checkpoints follow Lightning's convention: ``state_dict`` holds the averaged weights
(what a checkpoint is loaded for), the live ones ride along for an exact resume."""

from typing import Dict, Optional

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

LIVE_KEY = "weight_ema_live"  # checkpoint key: the live (training) weights while state_dict holds the average


class WeightEMA(Callback):
    """Validation, test, prediction and checkpoints use ``average = decay * average + (1 - decay) * weights``,
    updated every ``every_n_steps`` optimizer steps from ``start_step`` on (floating-point parameters and buffers:
    batch-norm's running statistics are averaged too). At the end of fit the model keeps the average.

    Args:
        decay: Weight of the old average per update; the average spans about ``every_n_steps / (1 - decay)`` steps.
        every_n_steps: Optimizer steps between updates.
        start_step: First optimizer step that updates (earlier weights are far from the optimum); the first
            update copies the weights."""

    def __init__(self, decay: float = 0.99, every_n_steps: PositiveInt = 1, start_step: NonNegativeInt = 0) -> None:
        if not 0.0 <= decay < 1.0:
            raise MisconfigurationException(f"WeightEMA decay={decay} must be in [0, 1), e.g. 0.99")
        self.decay = decay
        self.every_n_steps = every_n_steps
        self.start_step = start_step
        self.updates = 0  # a Python int: deciding "first update or not" never reads the device
        self._last_step = -1
        self._average: Optional[Dict[str, torch.Tensor]] = None
        self._live: Optional[Dict[str, torch.Tensor]] = None  # the module's tensors, looked up once per fit
        self._swapped = False
        self._finished = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and isinstance(trainer.strategy, (FSDPStrategy, ModelParallelStrategy)):
            raise MisconfigurationException("WeightEMA keeps a full copy of the weights: it does not support sharded "
                                            "strategies (fsdp); use ddp, dp or one device")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._live = None

    @staticmethod
    def _weights(pl_module: LightningModule) -> Dict[str, torch.Tensor]:
        """The module's floating-point state, as tensors that share storage with it."""
        return {k: v for k, v in pl_module.state_dict(keep_vars=False).items() if v.is_floating_point()}

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps so far: unchanged on accumulation's micro-batches
        if step == self._last_step or step < max(1, self.start_step) or step % self.every_n_steps:
            return
        self._last_step = step
        if self._live is None:  # not walking the module tree every step (a checkpoint loads into these same tensors)
            self._live = self._weights(pl_module)
        live = self._live
        if self._average is None or self.updates == 0:
            self._average = {k: v.detach().clone() for k, v in live.items()}
        else:
            torch._foreach_lerp_(list(self._average.values()), [live[k] for k in self._average], 1.0 - self.decay)
        self.updates += 1

    def _swap(self, pl_module: LightningModule) -> None:
        if self._average is None or self._finished:
            return
        live = self._weights(pl_module)
        for name, average in self._average.items():
            kept = live[name].clone()
            live[name].copy_(average)
            average.copy_(kept)
        self._swapped = not self._swapped

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._swapped:
            self._swap(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The model keeps the average: the test after fit and the returned module evaluate it."""
        if self._average is not None and not self._finished:
            live = self._weights(pl_module)
            for name, average in self._average.items():
                live[name].copy_(average)
            self._finished = True

    def state_dict(self) -> dict:
        return {"updates": self.updates, "last_step": self._last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.updates = int(state_dict["updates"])
        self._last_step = int(state_dict["last_step"])

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        if self._average is None or self._finished:
            return  # nothing averaged yet, or the model already holds the average
        weights = checkpoint["state_dict"]
        average = self._weights(pl_module) if self._swapped else self._average  # mid-validation: the model has it
        live = self._average if self._swapped else {k: weights[k] for k in self._average}
        checkpoint[LIVE_KEY] = {k: v.detach().clone() for k, v in live.items()}
        checkpoint["state_dict"] = {**weights, **{k: v.detach().clone() for k, v in average.items()}}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        """Lightning has loaded ``state_dict`` (the average) into the model: keep it as the average, put the live
        weights back. Test and predict keep the average; a checkpoint saved without this callback starts the average
        from its weights."""
        live = checkpoint.get(LIVE_KEY)
        if live is None or trainer.state.fn != TrainerFn.FITTING:
            return
        current = self._weights(pl_module)
        self._average = {k: v.detach().clone() for k, v in current.items() if k in live}
        for name, value in live.items():
            current[name].copy_(value.to(current[name].device))
