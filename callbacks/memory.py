"""Memory per rank: the model state each rank holds (what ddp replicates and fsdp shards), and the peak: CUDA
max-allocated on GPUs, the process's peak resident set size on CPU."""

import resource
import sys
from typing import Iterable, Tuple

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from callbacks.throughput import gather_rows, log_to_loggers
from lightning_modules.optim import local_shard


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process on ``device`` so far, in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def model_state_mb(module: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> Tuple[float, float]:
    """MiB of parameters and of optimizer state (momentum, Adam moments...) held by this process: under fsdp a
    parameter here is this rank's shard, so the figures are per rank."""
    params = sum(local_shard(p).numel() * p.element_size() for p in module.parameters())
    state = sum(
        local_shard(value).numel() * value.element_size()
        for optimizer in optimizers
        for per_param in optimizer.state.values()
        for value in per_param.values()
        if torch.is_tensor(value) and value.dim() > 0  # not the scalar step counters
    )
    return params / 2**20, state / 2**20


class PeakMemory(Callback):
    """After the first epoch, rank 0 prints and logs the largest rank's parameters and optimizer state; every epoch
    ``memory/peak_mb`` (largest over ranks) and, with several ranks, ``memory/peak_mb_rank<i>``."""

    def __init__(self) -> None:
        self._state_reported = False

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._state_reported:
            rows = gather_rows(trainer, model_state_mb(pl_module, trainer.optimizers))
            params_mb, optimizer_mb = map(max, zip(*rows))
            rank_zero_info(f"Model state per rank: parameters {params_mb:.2f} MiB, optimizer state {optimizer_mb:.2f} "
                           f"MiB (largest of {len(rows)} rank(s))")
            log_to_loggers(trainer, {"memory/parameters_mb": params_mb, "memory/optimizer_state_mb": optimizer_mb})
            self._state_reported = True
        per_rank = [row[0] for row in gather_rows(trainer, [peak_memory_mb(trainer.strategy.root_device)])]
        ranks = {f"memory/peak_mb_rank{rank}": value for rank, value in enumerate(per_rank)}
        log_to_loggers(trainer, {"memory/peak_mb": max(per_rank), **(ranks if len(ranks) > 1 else {})})
