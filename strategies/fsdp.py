"""``--strategy fsdp``: Lightning's FSDPStrategy, runnable on CPU over gloo (``fsdp_cpu``: Lightning refuses CPU, and
torch's FSDP needs the CPU device given), and reusing its wrapper for the test after fit (Lightning #20373).
Why layer-wise optimizers are refused: docs/strategies.md, "fsdp".
"""

from typing import Any, Optional

import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

# Optimizers whose update depends on whole-layer norms: wrong on flat shards.
LAYERWISE_OPTIMIZERS = ("lars", "lamb", "novograd")
FSDP_STRATEGY_NAMES = ("fsdp", "fsdp_cpu", "fsdp_cpu_offload")


class ShardedDataParallelStrategy(FSDPStrategy):
    """Registered as ``fsdp`` (CUDA, NCCL) and ``fsdp_cpu`` (CPU, gloo)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._wrapped: Optional[nn.Module] = None  # the FSDP module of the last setup, reused by later stages

    def _setup_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if self._wrapped is not None and self._wrapped.module is model:
            return self._wrapped  # fit, then test: the module is already sharded
        if self.root_device.type != "cpu" or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            self._wrapped = super()._setup_model(model)
            return self._wrapped
        # Lightning passes device_id=root_device.index, None on CPU, which torch rejects without an accelerator.
        self._wrapped = FullyShardedDataParallel(
            module=model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        )
        return self._wrapped


def is_fsdp(strategy: Any) -> bool:
    """True for ``--strategy fsdp``-like names and for FSDP class paths given in a config file."""
    if isinstance(strategy, str):
        return strategy in FSDP_STRATEGY_NAMES
    if isinstance(strategy, FSDPStrategy):
        return True
    class_path = getattr(strategy, "class_path", None)
    if class_path is None and isinstance(strategy, dict):
        class_path = strategy.get("class_path")
    return bool(class_path) and "FSDP" in str(class_path)
