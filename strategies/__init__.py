"""Strategies Lightning 2.x lacks, registered in Lightning's StrategyRegistry: ``dp`` (removed in Lightning 2.0) and
``fsdp`` as FSDP2 (``fully_shard``) on GPUs and on CPU over gloo (Lightning's own ``fsdp`` is FSDP1, GPUs only)."""

import re
from typing import Dict

from lightning.pytorch.strategies import StrategyRegistry

from strategies.dp import NO_GPU_MESSAGE, DataParallelStrategy
from strategies.fsdp import CPU_NAME, FullyShardedStrategy, is_fsdp, local_shard, unshardable_optimizer

__all__ = ["CPU_NAME", "DataParallelStrategy", "FullyShardedStrategy", "NO_GPU_MESSAGE", "describe_run", "is_fsdp",
           "local_shard", "register_strategies", "strategy_label", "unshardable_optimizer"]


def register_strategies() -> None:
    """Idempotent; the CLI calls it in every process, including the ones ddp launches."""
    if "dp" not in StrategyRegistry:
        StrategyRegistry.register(
            "dp", DataParallelStrategy, description="DataParallel: one process, batch split over the visible GPUs"
        )
    if StrategyRegistry["fsdp"]["strategy"] is not FullyShardedStrategy:
        for name in ("fsdp", CPU_NAME):
            StrategyRegistry.register(name, FullyShardedStrategy, override=True,
                                      description="FSDP2 (fully_shard): each rank holds 1/N of every parameter")


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
