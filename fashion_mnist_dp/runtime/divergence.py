"""Divergence: every rank stops at the same point when training diverged (Lightning trains on with a NaN loss and exits
0), exit 70, and no checkpoint keeps its weights: docs/reliability.md, "Divergence"."""

import math
from typing import List, Optional, Sequence

import torch
from lightning.pytorch import LightningModule, Trainer

from fashion_mnist_dp.runtime import compat
from fashion_mnist_dp.runtime.agreement import VALIDATION, Participant
from fashion_mnist_dp.runtime.errors import TrainingDiverged
from lightning_modules.optim import local_shard
from fashion_mnist_dp.strategies import is_fsdp

CHANCE_ACCURACY = 0.11  # 10 classes: 0.10, plus what a constant prediction gets on a slightly uneven split
NONE = -1.0
MAX_WINDOW = 1024  # batches kept between decision points before they are folded on the device anyway


def tensor_norms(tensors: Sequence[Optional[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """Each tensor's 2-norm in float32 (0 for a missing one; an fsdp DTensor: this rank's shard) from one fused
    ``_foreach_norm`` (one kernel on a GPU, not one per tensor), without a sync: not finite exactly when an element is
    nan or inf, or when its squares overflow (beyond ~1e19 an element: diverged anyway)."""
    local = [None if t is None else local_shard(t) for t in tensors]
    present = [i for i, t in enumerate(local) if t is not None]
    wide = torch.float64 if any(local[i].dtype == torch.float64 for i in present) else torch.float32  # 64-true
    if not present:
        return torch.zeros(len(local), device=device)
    norms = list(torch._foreach_norm([local[i] for i in present], 2, dtype=wide))
    if len(present) < len(local):
        zero, by_index = torch.zeros((), dtype=wide, device=norms[0].device), dict(zip(present, norms))
        norms = [by_index.get(i, zero) for i in range(len(local))]
    return torch.stack(norms).float().to(device)


def first_non_finite(tensors: Sequence[Optional[torch.Tensor]], device: Optional[torch.device] = None) -> torch.Tensor:
    """Index of the first tensor holding a nan or inf, or -1, as a device scalar (nothing waits for it)."""
    device = device or next((t.device for t in tensors if t is not None), torch.device("cpu"))
    # After a finite zero (so never empty): the first bad tensor's position, argmax, is its index + 1, and 0 if none.
    bad = ~torch.isfinite(torch.cat([torch.zeros(1, device=device), tensor_norms(tensors, device)]))
    return bad.int().argmax() - 1


def gradient_norms(params: Sequence[torch.nn.Parameter]) -> Sequence[torch.Tensor]:
    """Each parameter's gradient 2-norm (:func:`tensor_norms`), as the scalars one fused ``_foreach_norm`` returns
    (stacked at the decision point, not per step). float32 gradients take the fast path (asking for a float32 result
    costs a copy); others, e.g. bf16-true, are normed in float32 so a finite gradient cannot overflow."""
    grads = [p.grad for p in params]
    if all(type(g) is torch.Tensor and g.dtype is torch.float32 for g in grads):  # the common case: one call
        return torch._foreach_norm(grads, 2)
    return list(tensor_norms(grads, params[0].device).unbind())


def past_warmup(epochs_done: float, warmup_epochs: float, epochs_after_warmup: float) -> bool:
    """True once ``epochs_after_warmup`` epochs have passed since the warm-up ended."""
    return epochs_done + 1e-9 >= warmup_epochs + epochs_after_warmup


def advice(base_lr: Optional[float], fsdp: bool, scaled_lr: Optional[float] = None,
           effective_batch: Optional[int] = None) -> str:
    """The remedies; the lr as the user typed it and, when the rule changed it, what the run trained at."""
    lr = f" (now {base_lr:g})" if base_lr is not None else ""
    if base_lr is not None and scaled_lr is not None and not math.isclose(scaled_lr, base_lr):
        lr = f" (now {base_lr:g}, scaled to {scaled_lr:.4g} for the effective batch {effective_batch})"
    optimizer = "--optimizer lamb" if fsdp else "--optimizer novograd or lamb"
    return f"try a warm-up (--warmup_epochs 1 or more), a lower --lr{lr}, or a layer-wise optimizer ({optimizer})"


def describe(loss_nan: bool, loss_inf: bool, gradient: Optional[str], weight: Optional[str]) -> str:
    found = []
    if loss_nan or loss_inf:
        found.append(f"the training loss is {'nan' if loss_nan else 'inf'}")
    if gradient is not None:
        found.append(f"a gradient is not finite ({gradient})")
    if weight is not None:
        found.append(f"a weight or batch-norm statistic is not finite ({weight})")
    return ", ".join(found) or "a value overflows float32"


def merge(rows: List[List[float]]) -> List[float]:
    """Every rank's report as one: the earliest first bad step and what was bad then; the lowest bad weight index;
    accuracy at chance anywhere. Row layout: [first step, loss nan, loss inf, gradient bad, gradient index,
    weight index, at chance], -1 for none."""
    firsts = [row[0] for row in rows if row[0] >= 0]
    first = min(firsts) if firsts else NONE
    at_first = [row for row in rows if firsts and row[0] == first]
    gradient_indices = [row[4] for row in at_first if row[4] >= 0]
    weights = [row[5] for row in rows if row[5] >= 0]
    return [first, float(any(r[1] for r in at_first)), float(any(r[2] for r in at_first)),
            float(any(r[3] for r in at_first)), min(gradient_indices) if gradient_indices else NONE,
            min(weights) if weights else NONE, float(any(row[6] for row in rows))]


class DivergenceGuard(Participant):
    """Stops all ranks once a loss, gradient or weight is not finite, or validation accuracy is at chance
    ``epochs_after_warmup`` epochs after warm-up ended (not judged when ``limit_train_batches`` cuts the epochs
    short: a smoke test has not trained an epoch). Per batch it only keeps the loss and one fused norm per
    gradient (device tensors, no read); the window's first bad step is found at the decision point."""

    def __init__(self, chance_accuracy: float = CHANCE_ACCURACY, monitor: str = "val/acc",
                 epochs_after_warmup: float = 1.0) -> None:
        self.chance_accuracy = chance_accuracy
        self.monitor = monitor
        self.epochs_after_warmup = epochs_after_warmup
        self._params: List[torch.nn.Parameter] = []  # taken once the strategy has wrapped (fsdp: sharded) the model
        self._buffer_slots: List[tuple] = []  # (name, module, attribute) of each float buffer, found once
        self._gradients_checked = True
        self._stepped = False
        self._norms: Optional[Sequence[torch.Tensor]] = None  # this batch's gradient norms, one per parameter
        self._window: List[tuple] = []  # (step, loss, gradient norms or None) per batch since the last point
        self._first: Optional[torch.Tensor] = None  # [step, loss nan, loss inf, gradient bad, gradient index]

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._params = list(pl_module.parameters())
        # Found once (walking the modules costs a decision point more than the rest of it); read at each point, so
        # a module that replaces a buffer object is checked on the new one.
        self._buffer_slots = [(f"{prefix}.{name}" if prefix else name, module, name)
                              for prefix, module in pl_module.named_modules()
                              for name, buffer in module.named_buffers(recurse=False) if buffer.is_floating_point()]
        self._first = torch.full((5,), NONE, device=pl_module.device)
        # 16-mixed: the GradScaler skips steps with inf gradients and lowers its scale; that is normal.
        self._gradients_checked = getattr(trainer.strategy.precision_plugin, "scaler", None) is None

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        self._stepped = True
        if self._gradients_checked:
            self._norms = gradient_norms(self._params)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        """Keep this batch's loss and gradient norms for the next decision point: no device op, no host read."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        step = trainer.global_step if self._stepped else trainer.global_step + 1
        self._window.append((step, loss if torch.is_tensor(loss) else None, self._norms))
        self._norms, self._stepped = None, False
        if len(self._window) >= MAX_WINDOW:  # no decision point for that long (no Agreement): bounded memory
            self._fold_window(pl_module.device)

    def _fold_window(self, device: torch.device) -> None:
        """The window's first bad batch, if any and if none was found before, into ``_first``: a few vector ops."""
        window, self._window = self._window, []
        if not window:
            return
        zero = torch.zeros((), device=device)
        losses = [zero if loss is None else loss for _, loss, _ in window]
        try:
            losses = torch.stack(losses).float().reshape(len(window))
        except RuntimeError:  # not all 0-d (a loss of shape [1])
            losses = torch.stack([loss.reshape(()) for loss in losses]).float()
        width = len(self._params)
        missing = [zero] * width
        # Each row's norms after a finite zero (a column, too, for a model without parameters): the first bad
        # gradient's column, argmax, is its index + 1, and 0 (index -1) when there is none.
        norms = torch.stack([n for _, _, row in window for n in (zero, *(missing if row is None else row))])
        gradient_bad = (~torch.isfinite(norms.float())).view(len(window), 1 + width)
        loss_nan, loss_inf = torch.isnan(losses), torch.isinf(losses)
        row_bad = loss_nan | loss_inf | gradient_bad.any(dim=1)
        first_row = row_bad.int().argmax()
        steps = torch.tensor([float(step) for step, _, _ in window], device=device)
        gradient_index = gradient_bad[first_row].int().argmax() - 1
        now = torch.stack([steps[first_row], loss_nan[first_row].float(), loss_inf[first_row].float(),
                           (gradient_index >= 0).float(), gradient_index.float()])
        new = (self._first[0] < 0) & row_bad.any()
        self._first = torch.where(new, now, self._first)

    def contribute(self, trainer: Trainer, pl_module: LightningModule, point: str) -> torch.Tensor:
        """At a point of fit (Agreement's), so after ``on_train_start``: ``_first`` is there."""
        device = pl_module.device
        self._fold_window(device)
        state = [p.detach() for p in self._params] + [getattr(module, name) for _, module, name in self._buffer_slots]
        weight_index = first_non_finite(state, device).float()
        return torch.cat([self._first, weight_index.reshape(1), self._at_chance(trainer, pl_module, point).reshape(1)])

    def _at_chance(self, trainer: Trainer, pl_module: LightningModule, point: str) -> torch.Tensor:
        accuracy = trainer.callback_metrics.get(self.monitor) if point == VALIDATION else None
        warmup = float(getattr(getattr(pl_module, "lr_policy", None), "warmup_epochs", 0.0) or 0.0)
        limit = trainer.limit_train_batches
        smoke_test = (isinstance(limit, int) and not isinstance(limit, bool)) or (limit is not None and limit < 1.0)
        total = trainer.num_training_batches
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed  # validation may run mid-epoch
        fraction = min(1.0, done / total) if isinstance(total, int) and total > 0 and done else 1.0  # 1.0 at epoch end
        epoch = trainer.current_epoch + fraction
        if accuracy is None or smoke_test or not past_warmup(epoch, warmup, self.epochs_after_warmup):
            return torch.zeros((), device=pl_module.device)
        accuracy = torch.as_tensor(accuracy, device=pl_module.device).float()
        return ((~torch.isfinite(accuracy)) | (accuracy <= self.chance_accuracy)).float()

    def decide(self, trainer: Trainer, pl_module: LightningModule, point: str, rows: List[List[float]]) -> None:
        first, loss_nan, loss_inf, gradient_bad, gradient_index, weight_index, at_chance = merge(rows)
        if first < 0 and weight_index < 0 and not at_chance:
            return
        names = [n for n, _ in pl_module.named_parameters()] + [name for name, _, _ in self._buffer_slots]
        now = trainer.global_step
        if first >= 0 or weight_index >= 0:
            gradient = names[int(gradient_index)] if gradient_bad and gradient_index >= 0 else None
            weight = names[int(weight_index)] if first < 0 else None  # else a consequence of the bad step
            step = int(first) if first >= 0 else now
            what = (f"training diverged at optimizer step {step} (epoch {trainer.current_epoch + 1}): "
                    f"{describe(bool(loss_nan), bool(loss_inf), gradient, weight)}")
        else:
            value = float(trainer.callback_metrics.get(self.monitor, float("nan")))
            what = (f"training diverged: validation accuracy ({self.monitor}) is {value:.3f} after epoch "
                    f"{trainer.current_epoch + 1} (optimizer step {now}), at chance (<= {self.chance_accuracy:g}) "
                    f"{self.epochs_after_warmup:g} epoch(s) after warm-up ended")
        compat.no_checkpoint_on_exception(trainer)
        rates, plan = getattr(pl_module, "learning_rates", None), getattr(pl_module, "batch_plan", None)
        lrs = (rates.base_lr, rates.scaled_lr) if rates is not None else (None, None)
        effective = plan.effective_batch_size if plan is not None else None
        where = f" at step {now}" if first >= 0 or weight_index >= 0 else ""
        stop = TrainingDiverged(f"{what}; stopped on every rank{where}, no checkpoint written of these weights; "
                                f"{advice(lrs[0], is_fsdp(trainer.strategy), lrs[1], effective)}",
                                rank=trainer.global_rank, children=compat.launched_children(trainer, release=True))
        if trainer.is_global_zero:  # the run's record (metrics.csv) marks the epoch it stopped in
            for logger in trainer.loggers:
                logger.log_metrics({"epoch": trainer.current_epoch, "train/diverged": 1.0}, step=trainer.global_step)
                try:
                    getattr(logger, "write_now", logger.save)()  # MetricsCSV writes on a timer otherwise
                except OSError as error:  # a write on the way out must not replace the stop: the line names it
                    stop.add_note(f"{type(logger).__name__}'s record not written: {error.strerror or error}")
        raise stop
