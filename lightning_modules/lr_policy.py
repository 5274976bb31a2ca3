"""The batch and the learning rate (README, "Batch size and learning rate"): the batch plan (every batch number of a
run: per device, per process, effective), and the policy by which the optimizer's own lr (the base lr, known good at
``base_batch_size``) follows it: scaled to the effective batch, warmed up, then scheduled, over pure functions tests
can pin down. Computed once when fit configures its optimizer; read by the start block, the hyperparameters and the
throughput report."""

import math
import re
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Dict, Literal, Optional, Tuple

from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

ScalingRule = Literal["none", "linear", "sqrt"]
ScheduleName = Literal["constant", "cosine", "step"]


def strategy_label(strategy) -> str:
    """The registry name users type (``fsdp``, ``dp``), else ``DDPStrategy`` -> ``ddp``."""
    registered = getattr(type(strategy), "strategy_name", None)
    if registered:
        return registered
    name = type(strategy).__name__.removesuffix("Strategy")
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()


def describe_run(trainer) -> Dict[str, str]:
    """Where and how ``trainer`` trains: accelerator, strategy and process-group backend, as the start block says."""
    strategy = trainer.strategy
    return {"accelerator": type(trainer.accelerator).__name__.replace("Accelerator", "").lower(),
            "strategy": strategy_label(strategy),
            "backend": getattr(strategy, "process_group_backend", None) or "none"}


@dataclass(frozen=True)
class BatchPlan:
    batch_size_per_device: int
    devices_per_process: int  # devices one process drives: the GPUs of dp, else 1
    devices: int  # per node
    virtual_devices: int  # devices one process stands for (--virtual_devices: ghost batch-norm of their shards)
    num_nodes: int
    world_size: int  # processes
    accumulate_grad_batches: int
    steps_per_epoch: int = 0  # optimizer steps; 0 outside fit
    total_steps: int = 0  # 0: no end (no epoch or step limit)

    @property
    def batch_size_per_process(self) -> int:
        """Images per training-loader batch in one process (dp splits it over its GPUs)."""
        return self.batch_size_per_device * self.devices_per_process * self.virtual_devices

    @property
    def effective_batch_size(self) -> int:
        """Images in one optimizer step, summed over every device and accumulation step."""
        return (self.batch_size_per_device * self.devices * self.virtual_devices * self.num_nodes
                * self.accumulate_grad_batches)

    def as_dict(self) -> Dict[str, Any]:
        return {**asdict(self), "batch_size_per_process": self.batch_size_per_process,
                "effective_batch_size": self.effective_batch_size}

    @classmethod
    def of(cls, trainer, batch_size: int, virtual_devices: int = 1) -> "BatchPlan":
        """The plan of ``trainer``'s fit: the steps are Lightning's own count (``estimated_stepping_batches``, which
        loads the training data if it is not loaded yet)."""
        if trainer.train_dataloader is None:
            trainer.fit_loop.setup_data()  # also for max_epochs -1, where Lightning's estimate skips it
        batches, accumulate = trainer.num_training_batches, trainer.accumulate_grad_batches
        total = trainer.estimated_stepping_batches
        # plain ints: PositiveInt would reach hparams.yaml as an object
        return cls(batch_size_per_device=int(batch_size),
                   devices_per_process=int(getattr(trainer.strategy, "devices_per_process", 1)),
                   devices=int(trainer.num_devices), virtual_devices=int(virtual_devices),
                   num_nodes=int(trainer.num_nodes), world_size=int(trainer.world_size),
                   accumulate_grad_batches=int(accumulate),
                   steps_per_epoch=math.ceil(batches / accumulate) if math.isfinite(batches) else 0,
                   total_steps=int(total) if math.isfinite(total) and total > 0 else 0)

    def describe(self) -> str:
        """The batch line of the start block."""
        virtual = f"{self.virtual_devices} virtual x " if self.virtual_devices > 1 else ""
        return (f"{self.batch_size_per_device} per device x {self.devices} x {virtual}{self.num_nodes} x accumulate "
                f"{self.accumulate_grad_batches} = effective {self.effective_batch_size}")


def scale_lr(base_lr: float, base_batch_size: int, effective_batch: int, rule: ScalingRule) -> float:
    """Learning rate for ``effective_batch`` from one known at ``base_batch_size``: ``linear`` (Goyal et al.: the update
    per image stays constant for SGD), ``sqrt`` (its variance stays constant), ``none``."""
    ratio = effective_batch / base_batch_size
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    raise ValueError(f"unknown lr_policy.scaling {rule!r}; choose one of: none, linear, sqrt")


def lr_factor(step: int, *, warmup_steps: int, warmup_start_factor: float, total_steps: int,
              schedule: ScheduleName = "constant", step_size: int = 1, gamma: float = 0.1) -> float:
    """Multiplier of the scaled learning rate at optimizer step ``step`` (0-based): a linear warm-up from
    ``warmup_start_factor`` to 1 over ``warmup_steps``, then the schedule counted from its end."""
    if step < warmup_steps:
        return warmup_start_factor + (1.0 - warmup_start_factor) * step / warmup_steps
    after = step - warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(after, span) / span))
    if schedule == "step":
        return gamma ** (after // max(1, step_size))
    raise ValueError(f"unknown lr_policy.schedule {schedule!r}; choose one of: constant, cosine, step")


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
