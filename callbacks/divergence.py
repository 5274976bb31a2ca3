"""Divergence guard: every rank stops at the same optimizer step when training diverges, and no checkpoint keeps it.

Lightning 2.6 trains on with a NaN loss to the last epoch and exits 0 (``EarlyStopping``'s
``check_finite`` only looks at a monitored metric, at epoch end, after ``last.ckpt`` was
written). Here, after every training batch, each rank looks at its own loss, at the
gradients it held just before the optimizer step (its shard of them under fsdp) and at
its weights and batch-norm statistics after the step (its shard under fsdp); an
``all_reduce(MAX)`` of three flags makes the decision collective, so every rank raises :class:`TrainingDiverged`
at the same step. That all_reduce is shared with the preemption callback's (callbacks/step_flags.py):
one collective and one host sync per batch for both, the loss check included. A rank raising alone would leave the others waiting in their next
collective until the process group times out (30 min by default).

After warm-up has finished and one more epoch has passed, a validation accuracy at
chance (10 classes: <= 0.11) stops the run the same way: it has diverged or cannot learn.

Both checks run before any ``ModelCheckpoint`` saves (Lightning calls checkpoint callbacks
after all others, and saves at epoch end after the last batch's and validation's hooks), so
the diverged weights are never written, nor promoted to ``last.ckpt`` or best. Before raising,
checkpointing on exception (``ModelCheckpoint(save_on_exception=True)``, ``OnExceptionCheckpoint``)
is switched off for this exception: it would write exactly those weights.

train.py turns :class:`TrainingDiverged` into one line on rank 0 and exit code 70 on every rank.
"""

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.strategies import FSDPStrategy

from callbacks.step_flags import TRAIN_BATCH, VALIDATION, CollectiveCallback, all_max

CHANCE_ACCURACY = 0.11  # 10 classes: 0.10, plus what a constant prediction gets on a slightly uneven split


class TrainingDiverged(RuntimeError):
    """Raised on every rank at the same step. ``rank``: this process's global rank (rank 0 prints the line);
    ``children``: rank processes this launching process started and must wait for (see ``_release_children``)."""

    def __init__(self, message: str, rank: int = 0, children: Sequence = ()) -> None:
        super().__init__(message)
        self.rank = rank
        self.children = list(children)


@dataclass
class StepHealth:
    """What one rank saw at one training batch; parameter indices follow ``named_parameters()`` order."""

    loss_nan: bool = False
    loss_inf: bool = False
    bad_gradient: Optional[int] = None  # first parameter whose gradient is not finite
    bad_weight: Optional[int] = None  # first parameter (then float buffer) whose value is not finite

    @property
    def diverged(self) -> bool:
        return self.loss_nan or self.loss_inf or self.bad_gradient is not None or self.bad_weight is not None

    @staticmethod
    def encode_index(index: Optional[int], count: int) -> float:
        """``count - index`` (0 for none), so that a MAX over ranks keeps the smallest index any rank found."""
        return 0.0 if index is None else float(count - index)

    @staticmethod
    def decode_index(value: float, count: int) -> Optional[int]:
        return None if value <= 0 else count - int(round(value))

    def to_vector(self, count: int) -> List[float]:
        return [float(self.loss_nan), float(self.loss_inf), self.encode_index(self.bad_gradient, count),
                self.encode_index(self.bad_weight, count)]

    @classmethod
    def from_vector(cls, vector: Sequence[float], count: int) -> "StepHealth":
        return cls(vector[0] > 0, vector[1] > 0, cls.decode_index(vector[2], count), cls.decode_index(vector[3], count))

    def describe(self, names: Sequence[str]) -> str:
        found = []
        if self.loss_nan or self.loss_inf:
            found.append(f"the training loss is {'nan' if self.loss_nan else 'inf'}")
        if self.bad_gradient is not None:
            found.append(f"a gradient is not finite ({names[self.bad_gradient]})")
        if self.bad_weight is not None:
            found.append(f"a weight or batch-norm statistic is not finite ({names[self.bad_weight]})")
        return ", ".join(found)


def _sum(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.sum(dtype=torch.promote_types(tensor.dtype, torch.float32))


def finite_sum(tensors: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
    """The sum of all elements of ``tensors`` (float32 at least), on their device, without a sync: not finite
    when any element is nan or inf.

    nan and inf propagate through a sum; finite values overflow it only beyond 3e38, where the
    weights have diverged anyway. A sum reads each tensor once and allocates nothing: on CPU about
    10x cheaper than ``isfinite(t).all()`` or an infinity norm, which matters next to the small
    mlp's 2-3 ms steps.
    """
    present = [t for t in tensors if t is not None]
    if not present:
        return torch.zeros(())
    device = present[0].device
    return torch.stack([_sum(t).float().to(device) for t in present]).sum()


def first_non_finite(tensors: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
    """Index of the first tensor holding a nan or inf (judged by its sum, as :func:`finite_sum`), or -1."""
    present = [(i, t) for i, t in enumerate(tensors) if t is not None]
    if not present:
        return torch.tensor(-1)
    device = present[0][1].device
    bad = ~torch.stack([torch.isfinite(_sum(t)).to(device) for _, t in present])
    index = torch.tensor([i for i, _ in present], device=device)
    return torch.where(bad.any(), index[bad.int().argmax()], torch.tensor(-1, device=device))


def is_at_chance(accuracy: float, chance: float = CHANCE_ACCURACY) -> bool:
    return not math.isfinite(accuracy) or accuracy <= chance


def past_warmup(epochs_done: float, warmup_epochs: float, epochs_after_warmup: float) -> bool:
    """True once ``epochs_after_warmup`` epochs have passed since the warm-up ended."""
    return epochs_done + 1e-9 >= warmup_epochs + epochs_after_warmup


def advice(base_lr: Optional[float], fsdp: bool) -> str:
    """What to try, for the one line."""
    lr = f" (now {base_lr:g})" if base_lr is not None else ""
    optimizers = "" if fsdp else ", or a layer-wise optimizer (--optimizer novograd or lamb)"
    return f"try a warm-up (--warmup_epochs 1 or more), a lower --lr{lr}{optimizers}"


class DivergenceGuard(CollectiveCallback):
    """Stops all ranks at the first optimizer step with a non-finite loss, gradient or weight, and when validation
    accuracy is at chance ``epochs_after_warmup`` epochs after warm-up ended.

    Args:
        chance_accuracy: Validation accuracy at or below which the run counts as not learning (10 classes: 0.11).
        monitor: The logged validation accuracy.
        epochs_after_warmup: Epochs after the end of warm-up (``model.warmup_epochs``) before accuracy is judged.
    """

    def __init__(self, chance_accuracy: float = CHANCE_ACCURACY, monitor: str = "val/acc",
                 epochs_after_warmup: float = 1.0) -> None:
        self.chance_accuracy = chance_accuracy
        self.monitor = monitor
        self.epochs_after_warmup = epochs_after_warmup
        self._gradient_sum: Optional[torch.Tensor] = None
        self._gradients_checked = True
        self._stepped = False
        self._params: List[torch.nn.Parameter] = []  # taken once the strategy has wrapped (fsdp: sharded) the model
        self._state: List[torch.Tensor] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._params = list(pl_module.parameters())
        self._state = _state(pl_module)
        precision = getattr(trainer.strategy, "precision_plugin", None)
        # 16-mixed: the GradScaler skips steps with inf gradients and lowers its scale; that is normal.
        self._gradients_checked = getattr(precision, "scaler", None) is None

    # ------------------------------------------------------------------ per optimizer step
    # The common case (all finite) costs one sum per tensor and 3 numbers in the batch's one shared all_reduce
    # (callbacks/step_flags.py); which tensor went bad is only looked up once training has diverged.

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        self._stepped = True
        if self._gradients_checked:
            self._gradient_sum = finite_sum([p.grad for p in self._params])

    def flags(self, trainer: Trainer, pl_module: LightningModule, point: str, outputs) -> torch.Tensor:
        """After a batch: [loss, gradients, weights] not finite on this rank; after validation: [at chance]."""
        device = pl_module.device
        if point == TRAIN_BATCH:
            loss = _loss(outputs, device)
            gradients = self._gradient_sum if self._gradient_sum is not None else torch.zeros((), device=device)
            weights = finite_sum(self._state)
            return (~torch.isfinite(torch.stack([loss, gradients.to(device), weights.to(device)]))).float()
        accuracy = self._judged_accuracy(trainer, pl_module)
        return torch.tensor([float(accuracy is not None and is_at_chance(accuracy, self.chance_accuracy))],
                            device=device)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        agreed = self.agreed_flags(trainer, pl_module, TRAIN_BATCH, outputs)  # with preemption's: one all_reduce
        stepped, self._stepped, self._gradient_sum = self._stepped, False, None
        if not any(agreed):
            return
        # Diverged on some rank, so on every rank (same all-reduced flags): find out what, together.
        device = pl_module.device
        loss = _loss(outputs, device)
        names = [name for name, _ in pl_module.named_parameters()] + [name for name, _ in _float_buffers(pl_module)]
        count = len(names)
        grads = [p.grad for p in self._params] if self._gradients_checked else []
        details = torch.stack([torch.isnan(loss).float(), torch.isinf(loss).float(),
                               _encode_index(first_non_finite(grads).to(device), count),
                               _encode_index(first_non_finite(self._state).to(device), count)])
        health = StepHealth.from_vector(all_max(details).tolist(), count)
        step = trainer.global_step if stepped else trainer.global_step + 1
        self._stop(trainer, pl_module, f"training diverged at optimizer step {step} (epoch "
                                       f"{trainer.current_epoch + 1}): {health.describe(names) or 'a value overflows float32'}")

    # ------------------------------------------------------------------ per validation

    def _judged_accuracy(self, trainer: Trainer, pl_module: LightningModule) -> Optional[float]:
        """This validation's accuracy once warm-up plus ``epochs_after_warmup`` epochs have passed, else None."""
        accuracy = trainer.callback_metrics.get(self.monitor)
        if accuracy is None:
            return None
        warmup = float(getattr(pl_module.hparams, "warmup_epochs", 0.0) or 0.0)
        epochs_done = trainer.current_epoch + _epoch_fraction(trainer)
        if not past_warmup(epochs_done, warmup, self.epochs_after_warmup):
            return None
        return float(accuracy)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if any(self.agreed_flags(trainer, pl_module, VALIDATION)):
            value = float(trainer.callback_metrics.get(self.monitor, float("nan")))
            self._stop(trainer, pl_module,
                       f"training diverged: validation accuracy ({self.monitor}) is {value:.3f} after epoch "
                       f"{trainer.current_epoch + 1} (optimizer step {trainer.global_step}), at chance "
                       f"(<= {self.chance_accuracy:g}) {self.epochs_after_warmup:g} epoch(s) after warm-up ended")

    # ------------------------------------------------------------------ stopping

    def _stop(self, trainer: Trainer, pl_module: LightningModule, what: str) -> None:
        _no_checkpoint_on_exception(trainer)
        base_lr = getattr(pl_module.hparams, "base_lr", None)
        message = (f"{what}; stopped on every rank, no checkpoint written of these weights; "
                   f"{advice(base_lr, isinstance(trainer.strategy, FSDPStrategy))}")
        raise TrainingDiverged(message, rank=trainer.global_rank, children=_release_children(trainer))


def _encode_index(index: torch.Tensor, count: int) -> torch.Tensor:
    """:meth:`StepHealth.encode_index` on the device (-1: none), so that nothing waits for it before the all_reduce."""
    return torch.where(index >= 0, count - index, 0).float()


def _state(module: torch.nn.Module) -> list:
    """What a checkpoint saves of the model: parameters, then floating-point buffers (batch-norm statistics)."""
    return [p.detach() for p in module.parameters()] + [buffer for _, buffer in _float_buffers(module)]


def _float_buffers(module: torch.nn.Module) -> list:
    """(name, buffer) of the floating-point buffers (batch-norm running statistics), in a fixed order."""
    return [(name, buffer) for name, buffer in module.named_buffers() if buffer.is_floating_point()]


def _loss(outputs, device: torch.device) -> torch.Tensor:
    """The training step's loss as a float32 scalar on ``device`` (0 when the step returned none)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss.detach().float().reshape(()).to(device) if torch.is_tensor(loss) else torch.zeros((), device=device)


def _epoch_fraction(trainer: Trainer) -> float:
    """How much of the current epoch has been trained when validation runs (1.0 at epoch end)."""
    total = trainer.num_training_batches
    if not isinstance(total, int) or total <= 0:
        return 1.0
    done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
    return min(1.0, done / total) if done else 1.0


def _no_checkpoint_on_exception(trainer: Trainer) -> None:
    """Checkpoint-on-exception callbacks would save the diverged weights (and ``--ckpt_path last`` would pick
    OnExceptionCheckpoint's file): off for this exception."""
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and getattr(callback, "save_on_exception", False):
            callback.save_on_exception = False
        elif isinstance(callback, OnExceptionCheckpoint):
            callback.on_exception = lambda *args, **kwargs: None  # this instance only


def _release_children(trainer: Trainer) -> list:
    """The rank processes Lightning's launcher started from this process, taken out of its observer's sight.

    Lightning's ``_ChildProcessObserver`` SIGKILLs the launching process (rank 0) when a child exits
    non-zero. Every rank stops here at the same step, so the children exit 70 while rank 0 is still
    printing its line: rank 0 would end with 137 instead of 70, at random. The observer watches the
    launcher's ``procs`` list; emptying it ends the observer harmlessly, and train.py waits for the
    children instead, so none is left behind.
    """
    launcher = getattr(trainer.strategy, "launcher", None)
    procs = getattr(launcher, "procs", None)
    if not isinstance(procs, list) or not procs:
        return []
    children = list(procs)
    procs.clear()
    return children
