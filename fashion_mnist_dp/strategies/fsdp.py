"""``--strategy fsdp``: FSDP2 (``fully_shard``) through Lightning's ModelParallelStrategy, on GPUs and on CPU over
gloo, with full-weight checkpoints; NovoGrad refused: docs/strategies.md, "fsdp"."""

import inspect
from typing import Any, Optional

from lightning.pytorch.strategies import ModelParallelStrategy


# Lightning refuses any strategy *named* fsdp without a GPU (its FSDP1 check): on CPU the CLI names ours so.
CPU_NAME = "fsdp_cpu"


class FullyShardedStrategy(ModelParallelStrategy):
    """Registered as ``fsdp`` and ``fsdp_cpu``; the module's ``configure_model`` shards over its data-parallel mesh."""

    strategy_name = "fsdp"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("save_distributed_checkpoint", False)  # one file of full weights, written by rank 0
        super().__init__(**kwargs)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict:
        """Always without code (``weights_only=True``), as runtime/checkpoint_io.py loads for every other strategy.
        Lightning before 2.6 takes no ``weights_only``: there the file is one this run wrote or the CLI has already
        read without code (``--ckpt_path``: cli/app.py)."""
        if "weights_only" in inspect.signature(ModelParallelStrategy.load_checkpoint).parameters:
            return super().load_checkpoint(checkpoint_path, weights_only=True)
        return super().load_checkpoint(checkpoint_path)

    def setup_environment(self) -> None:
        # One data-parallel mesh dimension of every rank (ModelParallelStrategy's "auto" is nodes × devices)
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()


def unshardable_optimizer(optimizer_class: type) -> bool:
    """``torch_optimizer.NovoGrad`` or a subclass: its plain tensors beside DTensors."""
    from torch_optimizer import NovoGrad

    return isinstance(optimizer_class, type) and issubclass(optimizer_class, NovoGrad)


def is_fsdp(strategy: Any) -> bool:
    """True for ``--strategy fsdp`` and for an FSDP strategy given as a class path in a config file."""
    if isinstance(strategy, str):
        return strategy in ("fsdp", CPU_NAME)
    if isinstance(strategy, FullyShardedStrategy):
        return True
    class_path = getattr(strategy, "class_path", None)  # a Namespace from a config file
    return bool(class_path) and ("FSDP" in str(class_path) or "FullyShardedStrategy" in str(class_path))
