"""The batch plan: every batch and learning-rate number of a run, computed once, read by everyone who needs one.

The model builds it in ``setup`` (runtime facts from the trainer, the per-device batch linked from
``data.batch_size``, the number of training images from the data module); the data module's loaders,
the LR schedule, the start block, the hyperparameters and the throughput report read it. README,
"Batch size and learning rate", states the rules.
"""

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Union

from lightning_modules.optim import scale_lr


def batches_per_epoch(images: int, world_size: int, process_batch: int, limit: Union[int, float, None] = None) -> int:
    """Batches each process trains per epoch: a DistributedSampler's shard (padded to ceil(images / world size))
    in batches of ``process_batch``, then Lightning's ``limit_train_batches`` (int: a count, float: a fraction)."""
    batches = math.ceil(math.ceil(images / world_size) / process_batch)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    return batches if limit is None else int(batches * limit)


@dataclass(frozen=True)
class BatchPlan:
    batch_size_per_device: int
    devices_per_process: int  # devices one process drives: the GPUs of dp, else 1
    devices: int  # per node
    virtual_devices: int  # devices one process stands for (--virtual_devices: ghost batch-norm of their shards)
    num_nodes: int
    world_size: int  # processes
    accumulate_grad_batches: int
    base_batch_size: int
    base_lr: float
    lr_scaling: str
    scaled_lr: float
    warmup_epochs: float
    steps_per_epoch: int  # optimizer steps; 0 outside fit
    total_steps: int
    warmup_steps: int

    @property
    def batch_size_per_process(self) -> int:
        """Images per training-loader batch in one process (dp splits it over its GPUs)."""
        return self.batch_size_per_device * self.devices_per_process * self.virtual_devices

    @property
    def effective_batch_size(self) -> int:
        """Images in one optimizer step, summed over every device and accumulation step."""
        return (self.batch_size_per_device * self.devices * self.virtual_devices * self.num_nodes
                * self.accumulate_grad_batches)

    def loader_batch(self, per_device: int) -> int:
        """A loader's batch for ``per_device`` images per device (evaluation has its own batch size)."""
        return per_device * self.devices_per_process

    def as_dict(self) -> Dict[str, Any]:
        return {**asdict(self), "batch_size_per_process": self.batch_size_per_process,
                "effective_batch_size": self.effective_batch_size}

    @classmethod
    def build(cls, *, batch_size_per_device: int, devices: int, num_nodes: int, world_size: int, accumulate: int,
              devices_per_process: int, base_lr: float, base_batch_size: Optional[int], lr_scaling: str,
              warmup_epochs: float, train_images: Optional[int], limit_train_batches=None,
              max_epochs: Optional[int] = None, max_steps: int = -1, virtual_devices: int = 1) -> "BatchPlan":
        """``train_images`` None: not fitting (no steps). Steps follow Lightning's ``estimated_stepping_batches``:
        ceil(batches / accumulate) per epoch, times max_epochs, capped by max_steps."""
        base_batch = base_batch_size or batch_size_per_device
        effective = batch_size_per_device * devices * virtual_devices * num_nodes * accumulate
        steps_per_epoch = total = 0
        if train_images is not None:
            batches = batches_per_epoch(train_images, world_size * virtual_devices,  # a virtual device's shard
                                        batch_size_per_device * devices_per_process, limit_train_batches)
            steps_per_epoch = math.ceil(batches / accumulate)
            if max_epochs == -1:  # no epoch limit: max_steps, or no end (0)
                total = max(max_steps, 0)
            else:
                total = steps_per_epoch * max(max_epochs or 1, 1)
                total = min(total, max_steps) if max_steps != -1 else total
        # Plain numbers (jsonargparse's PositiveInt would reach hparams.yaml as a Python object).
        return cls(batch_size_per_device=int(batch_size_per_device), devices_per_process=int(devices_per_process),
                   devices=int(devices), virtual_devices=int(virtual_devices), num_nodes=int(num_nodes),
                   world_size=int(world_size),
                   accumulate_grad_batches=int(accumulate), base_batch_size=int(base_batch), base_lr=float(base_lr),
                   lr_scaling=str(lr_scaling), scaled_lr=float(scale_lr(base_lr, base_batch, effective, lr_scaling)),
                   warmup_epochs=float(warmup_epochs), steps_per_epoch=int(steps_per_epoch), total_steps=int(total),
                   warmup_steps=round(warmup_epochs * max(steps_per_epoch, 1)))


def format_plan(plan: BatchPlan, accelerator: str, strategy: str, backend: str, optimizer: str, schedule: str) -> str:
    """The block rank 0 prints before training: the numbers users otherwise have to derive by hand."""
    p = plan
    return "\n".join([
        "Run configuration",
        f"  world size      : {p.world_size} ({p.devices} device(s) x {p.num_nodes} node(s), {accelerator}, "
        f"strategy {strategy}, backend {backend})",
        f"  batch           : {p.batch_size_per_device} per device x {p.devices} x "
        f"{f'{p.virtual_devices} virtual x ' if p.virtual_devices > 1 else ''}{p.num_nodes} x accumulate "
        f"{p.accumulate_grad_batches} = effective {p.effective_batch_size}",
        f"  learning rate   : base {p.base_lr:g} at batch {p.base_batch_size} -> {p.scaled_lr:g} ({p.lr_scaling} scaling)",
        f"  warm-up         : {p.warmup_steps} optimizer steps ({p.steps_per_epoch} per epoch), then {schedule}",
        f"  optimizer       : {optimizer}",
    ])
