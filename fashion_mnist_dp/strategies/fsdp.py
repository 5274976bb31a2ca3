"""``--strategy fsdp``: FSDP2 (torch's ``fully_shard``: every parameter a DTensor sharded over the ranks) through
Lightning's ModelParallelStrategy, on GPUs over NCCL and on CPU over gloo. Every rank is one data-parallel shard (no
tensor parallelism), and checkpoints hold the full weights in one file, so they load in a one-process run.

LARS and LAMB compute their per-layer norms on DTensors, that is over the whole layer: they train as under ddp
(tests/test_fsdp.py). NovoGrad keeps a plain tensor beside DTensor parameters and fails: refused. docs/strategies.md.
"""

from typing import Any, Optional

from lightning.pytorch.strategies import ModelParallelStrategy


# Lightning refuses any strategy *named* fsdp without a GPU (its FSDP1 check): on CPU the CLI names ours so.
CPU_NAME = "fsdp_cpu"


class FullyShardedStrategy(ModelParallelStrategy):
    """Registered as ``fsdp`` and ``fsdp_cpu``; the LightningModule's ``configure_model`` shards its network over
    ``device_mesh["data_parallel"]`` (Lightning's pattern for ModelParallelStrategy)."""

    strategy_name = "fsdp"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("save_distributed_checkpoint", False)  # one file of full weights, written by rank 0
        super().__init__(**kwargs)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict:
        """Lightning's ModelParallelStrategy unpickles the file itself: always without code (``weights_only=True``),
        whatever the caller asks, as fashion_mnist_dp/runtime/checkpoint_io.py does for every other strategy."""
        return super().load_checkpoint(checkpoint_path, weights_only=True)

    def setup_environment(self) -> None:
        from fashion_mnist_dp.runtime import compat  # here: fashion_mnist_dp.runtime imports this package

        compat.shard_over_every_rank(self)  # a data-parallel mesh of all ranks, not Lightning's nodes × devices
        super().setup_environment()


def unshardable_optimizer(optimizer_class: type) -> Optional[str]:
    """``torch_optimizer.NovoGrad`` when ``optimizer_class`` is (or derives from) it: its state mixes plain tensors
    with fsdp's DTensors, which torch refuses; else None."""
    from torch_optimizer import NovoGrad

    is_novograd = isinstance(optimizer_class, type) and issubclass(optimizer_class, NovoGrad)
    return "torch_optimizer.NovoGrad" if is_novograd else None


def is_fsdp(strategy: Any) -> bool:
    """True for ``--strategy fsdp`` and for an FSDP strategy given as a class path in a config file."""
    if isinstance(strategy, str):
        return strategy in ("fsdp", CPU_NAME)
    if isinstance(strategy, FullyShardedStrategy):
        return True
    class_path = getattr(strategy, "class_path", None)
    if class_path is None and isinstance(strategy, dict):
        class_path = strategy.get("class_path")
    return bool(class_path) and ("FSDP" in str(class_path) or "FullyShardedStrategy" in str(class_path))
