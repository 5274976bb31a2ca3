"""Strategies Lightning 2.x lacks, registered in Lightning's StrategyRegistry: ``dp`` (removed in Lightning 2.0) and
``fsdp`` / ``fsdp_cpu`` (Lightning's FSDP fixed for test-after-fit and able to run on CPU over gloo)."""

from lightning.pytorch.strategies import StrategyRegistry

from strategies.dp import NO_GPU_MESSAGE, DataParallelStrategy
from strategies.fsdp import LAYERWISE_OPTIMIZERS, ShardedDataParallelStrategy, is_fsdp

__all__ = ["DataParallelStrategy", "LAYERWISE_OPTIMIZERS", "NO_GPU_MESSAGE", "ShardedDataParallelStrategy", "is_fsdp",
           "register_strategies"]


def register_strategies() -> None:
    """Idempotent; the CLI calls it in every process, including the ones ddp launches."""
    if "dp" not in StrategyRegistry:
        StrategyRegistry.register(
            "dp", DataParallelStrategy, description="DataParallel: one process, batch split over the visible GPUs"
        )
    if StrategyRegistry["fsdp"]["strategy"] is not ShardedDataParallelStrategy:
        StrategyRegistry.register(
            "fsdp", ShardedDataParallelStrategy, description="Fully Sharded Data Parallel on GPUs", override=True
        )
        StrategyRegistry.register(
            "fsdp_cpu",
            ShardedDataParallelStrategy,
            description="Fully Sharded Data Parallel on CPU processes over gloo",
            override=True,
            process_group_backend="gloo",
        )
