"""Every access to a private attribute of Lightning (or of LightningCLI's saved hyperparameters, or of torch's FSDP2
modules, whose comms have no getter), and nothing else.

Each was checked against Lightning 2.6.6: tests/unit/test_compat.py lists them and fails with the ones a newer
Lightning no longer has, so an upgrade breaks one test with a clear message instead of six modules at run time. Why
each is needed: docs/reliability.md.
"""

from datetime import timedelta
from typing import Any, Dict, List, Optional, Union

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

CLI_PRIVATE_KEYS = ("_instantiator",)  # LightningCLI stores it in hparams; not a hyperparameter


def disable_lightning_signal_handling(trainer: Trainer) -> None:
    """Lightning's handlers run a broadcast (and SLURM's a save and a requeue) inside the signal handler, and its
    epoch loop broadcasts rank 0's SIGTERM flag before every batch (a collective and a host read):
    fashion_mnist_dp/runtime/signals.py
    replaces both."""
    trainer._signal_connector.register_signal_handlers = lambda: None
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None


BATCH_LIMITS = tuple(f"trainer.limit_{stage}_batches" for stage in ("train", "val", "test", "predict"))


def batch_limits_count_first(parser) -> None:
    """Lightning types ``limit_*_batches`` ``Union[float, int]`` and jsonargparse tries float first, so ``1`` parsed
    and saved as 1.0 (every batch) where Lightning's Python API reads one batch. Int first: a whole number is a
    count, in flags, ``--config`` files and the saved config.yaml alike (jsonargparse's action holds the type)."""
    for action in parser._actions:
        if action.dest in BATCH_LIMITS:
            action._typehint = Union[int, float, None]


def collective_timeout(strategy) -> Optional[timedelta]:
    """The timeout a ddp/fsdp strategy hands its process group (None: a strategy of one process)."""
    return getattr(strategy, "_timeout", None)


def between_optimizer_steps(trainer: Trainer) -> bool:
    """After a batch whose gradients wait for the next one (``accumulate_grad_batches`` > 1)."""
    return trainer.accumulate_grad_batches > 1 and trainer.fit_loop.epoch_loop._should_accumulate()


def recreate_train_iterator(trainer: Trainer) -> None:
    """Create the epoch's data iterator again, drawing its base seed as an uninterrupted run did
    (fashion_mnist_dp/runtime/resume.py)."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:
        iter(fetcher)


def write_tensorboard_summaries(logger: TensorBoardLogger, summaries) -> None:
    """Summaries written as they are (``SummaryWriter.add_hparams`` would open a second run folder)."""
    writer = logger.experiment._get_file_writer()
    for summary in summaries:
        writer.add_summary(summary)


def ddp_comm_hook(strategy) -> tuple:
    """The DDP communication hook and its state the run's strategy was given (None, None: DDP's own allreduce).
    Lightning registers it on CUDA only; callbacks/throughput.py wraps it to time the buckets, on CPU too."""
    return getattr(strategy, "_ddp_comm_state", None), getattr(strategy, "_ddp_comm_hook", None)


def set_ddp_comm_hook(strategy, hook, state=None) -> None:
    """Give the strategy a DDP communication hook, as ``DDPStrategy(ddp_comm_hook=...)`` does (tests inject one)."""
    strategy._ddp_comm_hook, strategy._ddp_comm_state = hook, state


def fsdp_collectives(module) -> tuple:
    """An FSDP2 module's all-gather and reduce-scatter, to wrap (``set_custom_all_gather`` and
    ``set_custom_reduce_scatter`` have no getter); (None, None) unless it has one parameter group, as they need."""
    groups = module._get_fsdp_state()._fsdp_param_groups
    return (groups[0]._all_gather_comm, groups[0]._reduce_scatter_comm) if len(groups) == 1 else (None, None)


def launched_children(trainer: Trainer) -> List[Any]:
    """The rank processes Lightning's launcher started from this process (none in a rank it started)."""
    procs = getattr(trainer.strategy.launcher, "procs", None) if trainer.strategy.launcher is not None else None
    return list(procs) if isinstance(procs, list) else []


def release_children(trainer: Trainer) -> List[Any]:
    """:func:`launched_children`, taken out of the sight of Lightning's ``_ChildProcessObserver``, which SIGKILLs the
    launching process (exit 137) when a child exits non-zero: the caller waits for them instead."""
    children = launched_children(trainer)
    if children:
        trainer.strategy.launcher.procs.clear()
    return children


def shard_over_every_rank(strategy) -> None:
    """ModelParallelStrategy's "auto" mesh is nodes × devices (data × tensor parallel): FSDP alone wants one
    data-parallel dimension of every rank (fashion_mnist_dp/strategies/fsdp.py)."""
    strategy._data_parallel_size = strategy.num_nodes * strategy.num_processes
    strategy._tensor_parallel_size = 1


def public_hparams(params: Dict[str, Any]) -> Dict[str, Any]:
    return {key: value for key, value in params.items() if key not in CLI_PRIVATE_KEYS}
