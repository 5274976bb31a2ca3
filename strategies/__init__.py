"""Strategies Lightning 2.x lacks, registered in Lightning's StrategyRegistry on import.

``dp``: Lightning 2.0 removed DataParallel; this brings it back for one process over several GPUs.
``fsdp_cpu``: Lightning refuses FSDP without a GPU; this runs torch FSDP over gloo on CPU, so
sharding runs (and is tested) on any machine. train.py picks it for ``--strategy fsdp`` on CPU.
"""

from lightning.pytorch.strategies import StrategyRegistry

from strategies.dp import DataParallelStrategy

__all__ = ["DataParallelStrategy", "register_strategies"]


def register_strategies() -> None:
    """Idempotent; train.py calls it in every process it starts, including the ones ddp launches."""
    if "dp" not in StrategyRegistry:
        StrategyRegistry.register(
            "dp", DataParallelStrategy, description="DataParallel: one process, batch split over the visible GPUs"
        )

