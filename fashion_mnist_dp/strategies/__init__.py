"""Strategies Lightning 2.x lacks, in its StrategyRegistry: ``dp``, and ``fsdp`` as FSDP2 (docs/strategies.md)."""

from lightning.pytorch.strategies import StrategyRegistry

from fashion_mnist_dp.strategies.dp import DataParallelStrategy, require_gpus
from fashion_mnist_dp.strategies.fsdp import CPU_NAME, FullyShardedStrategy, is_fsdp, unshardable_optimizer

__all__ = ["CPU_NAME", "DataParallelStrategy", "FullyShardedStrategy", "is_fsdp", "register_strategies", "require_gpus",
           "unshardable_optimizer"]


def register_strategies() -> None:
    """Every process calls it; registering again (override) leaves the same entries."""
    StrategyRegistry.register("dp", DataParallelStrategy, override=True,
                              description="DataParallel: one process, batch split over the visible GPUs")
    for name in ("fsdp", CPU_NAME):
        StrategyRegistry.register(name, FullyShardedStrategy, override=True,
                                  description="FSDP2 (fully_shard): each rank holds 1/N of every parameter")
