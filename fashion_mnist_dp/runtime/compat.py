"""Every access to a private attribute of Lightning (or of LightningCLI's saved hyperparameters, or of torch's FSDP2
modules), and nothing else; tests/unit/test_compat.py checks each against Lightning 2.6.6 (docs/reliability.md)."""

from datetime import timedelta
from typing import Any, Dict, List, Optional, Union
from weakref import WeakKeyDictionary

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import Checkpoint, EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer import call
from lightning.pytorch.utilities.model_helpers import is_overridden


def disable_lightning_signal_handling(trainer: Trainer) -> None:
    """Lightning's signal handlers and its per-batch SIGTERM broadcast off: runtime/signals.py replaces both."""
    trainer._signal_connector.register_signal_handlers = lambda: None
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None


def batch_limits_count_first(parser) -> None:
    """``limit_*_batches``: a whole number is a count (jsonargparse tried float first: ``1`` meant every batch)."""
    limits = {f"trainer.limit_{stage}_batches" for stage in ("train", "val", "test", "predict")}
    for action in parser._actions:
        if action.dest in limits:
            action._typehint = Union[int, float, None]


def ask_batch_hook_owners_once(trainer: Trainer) -> None:
    """Which object (datamodule or model) runs each batch-transfer hook, decided now: Lightning asks again at each of
    a batch's three hooks (six ``is_overridden`` calls a step: host time, docs/benchmarks.md). Its warnings come out
    here."""
    selector = trainer._data_connector._datahook_selector
    if selector is not None:
        owners = {hook: selector.get_instance(hook) for hook in selector._valid_hooks}
        selector.get_instance = owners.__getitem__


_LIGHTNING_DISPATCH = call._call_callback_hooks
_PLANS: "WeakKeyDictionary[Trainer, dict]" = WeakKeyDictionary()  # trainer -> {(hook, monitoring): [(callback, label)]}


def call_only_overridden_hooks(trainer: Trainer, on: bool = True) -> None:
    """Lightning's dispatch of ``trainer``'s callback hooks without the callbacks that leave a hook as
    ``Callback``'s no-op: each costs a profiler context and a state key per hook, ~150 µs a step for 20 callbacks
    (docs/benchmarks.md). The others run as Lightning runs them: in order, under the same profiler label."""
    call._call_callback_hooks = _call_overridden_hooks
    if on:
        _PLANS[trainer] = {}
    else:
        _PLANS.pop(trainer, None)


def _call_overridden_hooks(trainer: Trainer, hook_name: str, *args: Any, monitoring_callbacks: Optional[bool] = None,
                           **kwargs: Any) -> None:
    plans = _PLANS.get(trainer)
    if plans is None:
        _LIGHTNING_DISPATCH(trainer, hook_name, *args, monitoring_callbacks=monitoring_callbacks, **kwargs)
        return
    if plans.get("callbacks") != trainer.callbacks:  # planned again whenever the list changes
        plans.clear()
        plans["callbacks"] = list(trainer.callbacks)
    plan = plans.get((hook_name, monitoring_callbacks))
    if plan is None:
        plan = plans[hook_name, monitoring_callbacks] = _plan(trainer, hook_name, monitoring_callbacks)
    if not plan:
        return
    pl_module = trainer.lightning_module
    if pl_module:  # object's __setattr__, as Lightning's result collection does: nn.Module's checks are host time
        previous = pl_module._current_fx_name
        object.__setattr__(pl_module, "_current_fx_name", hook_name)
    for callback, label in plan:
        with trainer.profiler.profile(label):
            getattr(callback, hook_name)(trainer, pl_module, *args, **kwargs)
    if pl_module:
        object.__setattr__(pl_module, "_current_fx_name", previous)


def _plan(trainer: Trainer, hook_name: str, monitoring_callbacks: Optional[bool]) -> list:
    """The callbacks Lightning would call for this hook that do something, with Lightning's profiler label."""
    return [(c, f"[Callback]{c.state_key}.{hook_name}") for c in trainer.callbacks
            if (monitoring_callbacks is None or isinstance(c, (EarlyStopping, Checkpoint)) == monitoring_callbacks)
            and callable(getattr(c, hook_name, None))
            and (not hasattr(Callback, hook_name) or is_overridden(hook_name, c, Callback))]


def no_checkpoint_on_exception(trainer: Trainer) -> None:
    """Switch off the checkpoint-on-exception callbacks for the exception being handled (this trainer only)."""
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and getattr(callback, "save_on_exception", False):
            callback.save_on_exception = False
        elif isinstance(callback, OnExceptionCheckpoint):
            callback.on_exception = lambda *args, **kwargs: None  # this instance only


def saves_on_train_steps(checkpoint) -> bool:
    """Whether a ModelCheckpoint may save after a training batch (``every_n_train_steps`` or
    ``train_time_interval``); if not, its ``on_train_batch_end`` only finds that it has nothing to do."""
    return checkpoint._every_n_train_steps >= 1 or checkpoint._train_time_interval is not None


def collective_timeout(strategy) -> Optional[timedelta]:
    """The timeout a ddp/fsdp strategy hands its process group (None: a strategy of one process)."""
    return getattr(strategy, "_timeout", None)


def between_optimizer_steps(trainer: Trainer) -> bool:
    """After a batch whose gradients wait for the next one (``accumulate_grad_batches`` > 1)."""
    return trainer.accumulate_grad_batches > 1 and trainer.fit_loop.epoch_loop._should_accumulate()


def recreate_train_iterator(trainer: Trainer) -> None:
    """Create the epoch's data iterator again, drawing its base seed as an uninterrupted run did."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:
        iter(fetcher)


def write_tensorboard_summaries(logger: TensorBoardLogger, summaries) -> None:
    """Summaries written as they are (``SummaryWriter.add_hparams`` would open a second run folder)."""
    writer = logger.experiment._get_file_writer()
    for summary in summaries:
        writer.add_summary(summary)


def ddp_comm_hook(strategy) -> tuple:
    """The DDP communication hook's state and hook the strategy was given (None, None: DDP's own allreduce)."""
    return getattr(strategy, "_ddp_comm_state", None), getattr(strategy, "_ddp_comm_hook", None)


def set_ddp_comm_hook(strategy, hook, state=None) -> None:
    """Give the strategy a DDP communication hook, as ``DDPStrategy(ddp_comm_hook=...)`` does."""
    strategy._ddp_comm_hook, strategy._ddp_comm_state = hook, state


def fsdp_collectives(module) -> tuple:
    """An FSDP2 module's all-gather and reduce-scatter (no getter), with one parameter group; else (None, None)."""
    groups = module._get_fsdp_state()._fsdp_param_groups
    return (groups[0]._all_gather_comm, groups[0]._reduce_scatter_comm) if len(groups) == 1 else (None, None)


def launched_children(trainer: Trainer) -> List[Any]:
    """The rank processes Lightning's launcher started from this process (none in a rank it started)."""
    procs = getattr(trainer.strategy.launcher, "procs", None)  # the launcher may be None
    return list(procs) if isinstance(procs, list) else []


def release_children(trainer: Trainer) -> List[Any]:
    """:func:`launched_children`, out of sight of Lightning's observer (it SIGKILLs the launcher on a failed rank)."""
    children = launched_children(trainer)
    if children:
        trainer.strategy.launcher.procs.clear()
    return children


class CheckpointHparamsOurs(LightningCLI):
    """LightningCLI without its merge of a checkpoint's hyperparameters over the parsed flags (an unverified second
    read): the CLI builds that config in layers itself (fashion_mnist_dp/cli/checkpoint_hparams.py)."""

    def _parse_ckpt_path(self) -> None:
        pass


def public_hparams(params: Dict[str, Any]) -> Dict[str, Any]:
    """Without ``_instantiator``: LightningCLI stores it in hparams; not a hyperparameter."""
    return {key: value for key, value in params.items() if key != "_instantiator"}
