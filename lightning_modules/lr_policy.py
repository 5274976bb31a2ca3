"""The learning-rate policy: how the optimizer's own lr (the base lr, known good at ``base_batch_size``) follows a run,
scaled to the effective batch, warmed up, then scheduled. One object over optim.py's pure math, fed by the batch plan
(README, "Batch size and learning rate")."""

import math
from dataclasses import dataclass
from functools import partial
from typing import Optional, Tuple

from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from lightning_modules.batch_plan import BatchPlan
from lightning_modules.optim import ScalingRule, ScheduleName, lr_factor, scale_lr


@dataclass(frozen=True)
class LearningRates:
    """What the policy made of one run's optimizer: the numbers of the start block and the hyperparameters."""

    base_lr: float
    base_batch_size: int
    scaled_lr: float
    lr_scaling: str
    warmup_steps: int
    warmup_start_lr: float
    schedule: str

    @property
    def per_step(self) -> bool:
        """Whether the lr changes from step to step (warm-up, a decay): else stepping the schedule each optimizer step
        is host time for nothing, and once an epoch does."""
        return self.warmup_steps > 0 or self.schedule != "constant"

    def describe(self, plan: BatchPlan) -> str:
        return "\n".join([
            f"  learning rate   : base {self.base_lr:g} at batch {self.base_batch_size} -> {self.scaled_lr:g} "
            f"({self.lr_scaling} scaling)",
            f"  warm-up         : {self.warmup_steps} optimizer steps ({plan.steps_per_epoch} per epoch), then "
            f"{self.schedule}"])


@dataclass(frozen=True)
class LRPolicy:
    """Args:
        scaling: lr = base lr × f(effective batch / base_batch_size): ``none``, ``linear`` or ``sqrt``.
        base_batch_size: The batch the optimizer's lr was tuned for. Default: the per-device batch, i.e. the lr of
            the single-device recipe.
        warmup_epochs: Epochs (fractions allowed) over which the lr climbs from ``warmup_start_lr`` to the scaled lr,
            stepped per optimizer step.
        warmup_start_lr: The lr at the first warm-up step. Default: the base lr (the workshop's warm-up from the
            single-device lr to the scaled one); lower for a one-cycle style ramp.
        schedule: After warm-up: ``constant``, ``cosine`` (to zero at the last step) or ``step``.
        step_epochs: For ``step``: epochs between decays.
        gamma: For ``step``: the factor of each decay."""

    scaling: ScalingRule = "linear"
    base_batch_size: Optional[PositiveInt] = None
    warmup_epochs: NonNegativeFloat = 0.0
    warmup_start_lr: Optional[PositiveFloat] = None
    schedule: ScheduleName = "constant"
    step_epochs: PositiveFloat = 10.0
    gamma: PositiveFloat = 0.1

    def __post_init__(self) -> None:
        # jsonargparse's PositiveFloat and NonNegativeFloat let inf through, and the schedule would overflow.
        for key in ("warmup_epochs", "warmup_start_lr", "step_epochs", "gamma"):
            value = getattr(self, key)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"model.lr_policy.{key} must be a finite number, got {value}")

    def learning_rates(self, base_lr: float, plan: BatchPlan) -> LearningRates:
        base_batch = self.base_batch_size or plan.batch_size_per_device
        return LearningRates(
            base_lr=float(base_lr), base_batch_size=int(base_batch),
            scaled_lr=float(scale_lr(base_lr, base_batch, plan.effective_batch_size, self.scaling)),
            lr_scaling=self.scaling, warmup_steps=round(self.warmup_epochs * max(plan.steps_per_epoch, 1)),
            warmup_start_lr=float(self.warmup_start_lr or base_lr), schedule=self.schedule)

    def apply(self, optimizer: Optimizer, plan: BatchPlan) -> Tuple[LearningRates, LambdaLR]:
        """Set every parameter group of ``optimizer`` (built at its own lr, the base lr) to the scaled lr; returns the
        numbers and the per-step schedule of warm-up and decay around the scaled lr."""
        rates = self.learning_rates(optimizer.defaults["lr"], plan)
        for group in optimizer.param_groups:
            group["lr"] = rates.scaled_lr
        return rates, LambdaLR(optimizer, partial(
            lr_factor, warmup_steps=rates.warmup_steps, warmup_start_factor=rates.warmup_start_lr / rates.scaled_lr,
            total_steps=plan.total_steps, schedule=self.schedule,
            step_size=max(1, round(self.step_epochs * max(plan.steps_per_epoch, 1))), gamma=self.gamma))


def continue_schedule(scheduler: LambdaLR, step: int) -> None:
    """After its optimizer's groups got new initial lrs: the schedule's base lrs follow them, the schedule is at
    optimizer step ``step`` (whatever interval the checkpoint's schedule was stepped at), and each group's lr is the
    new base at that step (the product LambdaLR.step computes)."""
    scheduler.base_lrs = [group["initial_lr"] for group in scheduler.optimizer.param_groups]
    scheduler.last_epoch = step
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(step)
