"""The batch plan: every batch number of a run, computed once when fit configures its optimizer, read by the
learning-rate policy, the start block, the hyperparameters and the throughput report (README, "Batch size and
learning rate")."""

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict


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
