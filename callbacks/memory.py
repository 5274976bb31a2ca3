"""Peak memory per rank: CUDA max-allocated on GPUs, the process's peak resident set size on CPU."""

import resource
import sys

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.throughput import log_to_loggers


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process on ``device`` so far, in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class PeakMemory(Callback):
    """Logs ``memory/peak_mb`` (the largest over ranks) and ``memory/peak_mb_rank<i>`` each epoch."""

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        device = trainer.strategy.root_device
        mine = torch.tensor([peak_memory_mb(device)], dtype=torch.float64, device=device)
        per_rank = trainer.strategy.all_gather(mine).reshape(-1).cpu().tolist()
        metrics = {"memory/peak_mb": max(per_rank)}
        metrics.update({f"memory/peak_mb_rank{rank}": value for rank, value in enumerate(per_rank)})
        log_to_loggers(trainer, metrics)
