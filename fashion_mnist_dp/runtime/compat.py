"""Every access to a private attribute of Lightning (or of LightningCLI's saved hyperparameters, jsonargparse's parser,
or torch's FSDP2 and SummaryWriter), and nothing else. Each is checked where it runs (``check_supported``): a mismatch
ends a run whose guarantee depends on it in one line, or turns off the optimisation it serves, and the start block
says so (docs/reliability.md); tests/unit/test_compat.py checks them against the installed versions."""

import atexit
import importlib
import inspect
from datetime import timedelta
from typing import Any, Dict, List, Optional, Union
from weakref import WeakKeyDictionary

import jsonargparse
import lightning
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer import call
from lightning.pytorch.utilities.model_helpers import is_overridden
from packaging.version import Version
from torch.distributed.fsdp import FSDPModule
from torch.utils.tensorboard import SummaryWriter

SUPPORTED = "Lightning 2.5.0 to 2.6.6 with torch 2.6.0 to 2.15.0"  # CI's two legs (docs/testing.md)
DISPATCH, BATCH_HOOKS = "LeanDispatch's hook calls", "LeanDispatch's batch-hook owners asked once"
EPOCH_END_CHECK = "a validation after every epoch's last batch"
SIGTERM_BROADCAST = "Lightning's per-step SIGTERM broadcast off"
TIMED_FSDP = "the breakdown's timed fsdp collectives"
_UNUSED = object()  # an owner this run does not reach, or an attribute that is not there


def _reach(owner: Any, name: str) -> Any:
    """``owner.name`` (``owner``: an object, or a module's dotted name), else a stand-in with no attribute."""
    try:
        return getattr(importlib.import_module(owner) if isinstance(owner, str) else owner, name)
    except (ImportError, AttributeError):
        return type(f"{owner if isinstance(owner, str) else type(owner).__name__}.{name}", (), {})


def _takes(*names: str):
    """A shape: a function whose parameters are ``names``."""
    return lambda value: callable(value) and tuple(inspect.signature(value).parameters) == names


def _accesses(trainer: Trainer) -> list:
    """(whether a guarantee depends on it, what it serves, owner, attribute, shape) of each access this run makes."""
    strategy, loop, launcher = trainer.strategy, trainer.fit_loop, trainer.strategy.launcher
    only = lambda used, owner: owner if used else _UNUSED  # noqa: E731
    fsdp, timed_fsdp = isinstance(strategy, ModelParallelStrategy), "cpu" == strategy.root_device.type  # CUDA: untimed
    hooks = _reach("lightning.pytorch.trainer.connectors.data_connector", "_DataHookSelector")
    fsdp_state = _reach("torch.distributed.fsdp._fully_shard._fsdp_state", "FSDPState")
    fsdp_group = _reach("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup")
    return [
        (True, "Preemption's signal handling (runtime/signals.py)", _reach(trainer, "_signal_connector"),
         "register_signal_handlers", _takes()),
        (True, "a stop between accumulated batches", loop.epoch_loop, "_should_accumulate", _takes()),
        (True, "exact resume", loop, "_data_fetcher", None),
        (True, "the user's flags over a checkpoint's settings", only(  # added in 2.5.5: before, no merge to turn off
            Version(lightning.__version__) >= Version("2.5.5"), LightningCLI), "_parse_ckpt_path", _takes("self")),
        (True, "a failed rank's exit code", only(launcher is not None, launcher), "procs",
         lambda procs: isinstance(procs, list)),
        (True, "fsdp's mesh of every rank", only(fsdp, strategy), "_data_parallel_size", None),
        (True, "fsdp's mesh of every rank", only(fsdp, strategy), "_tensor_parallel_size", None),
        (True, "TensorBoard's hparams", only(any(isinstance(x, TensorBoardLogger) for x in trainer.loggers),
                                             SummaryWriter), "_get_file_writer", _takes("self")),
        (False, DISPATCH, call, "_call_callback_hooks",
         _takes("trainer", "hook_name", "args", "monitoring_callbacks", "kwargs")),
        (False, DISPATCH, LightningModule(), "_current_fx_name", None),
        (False, BATCH_HOOKS, _reach(trainer, "_data_connector"), "_datahook_selector", None),
        (False, BATCH_HOOKS, hooks, "_valid_hooks", None),
        (False, BATCH_HOOKS, hooks, "get_instance", _takes("self", "hook_name")),
        (False, EPOCH_END_CHECK, loop.epoch_loop, "_should_check_val_fx", _takes("data_fetcher")),
        (False, EPOCH_END_CHECK, loop.epoch_loop, "_should_check_val_epoch", _takes()),
        (False, SIGTERM_BROADCAST, only(  # added in 2.5.2
            Version(lightning.__version__) >= Version("2.5.2"), loop.epoch_loop), "_broadcast_sigterm_tensor",
         _takes()),
        (False, "the start block's collective wait", only(hasattr(strategy, "process_group_backend"), strategy),
         "_timeout", None),
        (False, "the breakdown's timed DDP all-reduce", only(isinstance(strategy, DDPStrategy), strategy),
         "_ddp_comm_hook", None),
        (False, TIMED_FSDP, only(fsdp and timed_fsdp, fsdp_state()), "_fsdp_param_groups", None),
        (False, TIMED_FSDP, only(fsdp and timed_fsdp, FSDPModule), "_get_fsdp_state", _takes("self")),
        (False, TIMED_FSDP, only(fsdp and timed_fsdp, fsdp_group), "__init__",  # instance attributes: what it sets
         lambda init: {"_all_gather_comm", "_reduce_scatter_comm"} <= set(init.__code__.co_names)),
    ]


def unfit(trainer: Trainer) -> Dict[str, tuple]:
    """What each access this Lightning and torch do not fit serves: (a guarantee depends on it, ``Owner.attribute``)."""
    found = {}
    for guarantee, serves, owner, name, shape in _accesses(trainer):
        value = getattr(owner, name, _UNUSED) if owner is not _UNUSED else None
        if value is _UNUSED or (shape is not None and value is not None and not shape(value)):
            found.setdefault(serves, (guarantee, f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"))
    return found


def check_supported(trainer: Trainer) -> List[str]:
    """One line (a ``MisconfigurationException``: exit 2) where a guarantee's access does not fit; else the start
    block's line for each optimisation turned off."""
    lines, versions = [], f"Lightning {lightning.__version__} with torch {torch.__version__}"
    for serves, (guarantee, attribute) in unfit(trainer).items():
        if guarantee:
            raise MisconfigurationException(f"{serves} relies on {attribute}, which {versions} lacks or changed: "
                                            f"install {SUPPORTED} (setup.cfg)")
        lines.append(f"  turned off      : {serves} ({versions} lacks or changed {attribute})")
    return lines


def disable_lightning_signal_handling(trainer: Trainer) -> None:
    """Lightning's signal handlers and its per-batch SIGTERM broadcast off: runtime/signals.py replaces both."""
    trainer._signal_connector.register_signal_handlers = lambda: None
    loop = trainer.fit_loop.epoch_loop
    if hasattr(loop, "_broadcast_sigterm_tensor") and SIGTERM_BROADCAST not in unfit(trainer):  # Lightning >= 2.5.2
        loop._broadcast_sigterm_tensor = lambda: None


def validate_after_every_epochs_last_batch(trainer: Trainer) -> None:
    """A fractional ``val_check_interval`` validates after every such share of an epoch's batches, and so after its
    last batch only when their number divides (469 at 0.5: after batches 234 and 468). Here the last share ends with
    the last batch (234 and 469), so the epoch's line and its checkpoints hold the validation of its last weights."""
    loop = trainer.fit_loop.epoch_loop
    if EPOCH_END_CHECK in unfit(trainer) or trainer.check_val_every_n_epoch is None:  # None: every N batches
        return
    lightning_says = loop._should_check_val_fx

    def at_shares_and_the_last_batch(data_fetcher) -> bool:  # the same shape: checked again after this
        share = trainer.val_check_batch  # set when fit starts; inf: an iterable without a length
        if not isinstance(share, int):
            return lightning_says(data_fetcher)
        if loop.batch_progress.is_last_batch:
            return lightning_says(data_fetcher) or loop._should_check_val_epoch()
        last_share = loop.batch_idx + 1 + share > trainer.num_training_batches and not trainer.should_stop
        return lightning_says(data_fetcher) and not last_share

    loop._should_check_val_fx = at_shares_and_the_last_batch


def batch_limits_count_first(parser) -> None:
    """``limit_*_batches``: a whole number is a count (jsonargparse tried float first: ``1`` meant every batch)."""
    limits = {f"trainer.limit_{stage}_batches" for stage in ("train", "val", "test", "predict")}
    for action in parser._actions:
        if action.dest in limits:
            if not hasattr(action, "_typehint"):
                raise MisconfigurationException(f"--{action.dest} as a count relies on jsonargparse's "
                                                f"ActionTypeHint._typehint, which jsonargparse "
                                                f"{jsonargparse.__version__} lacks: install 4.51.0 to 4.53.0")
            action._typehint = Union[int, float, None]


def ask_batch_hook_owners_once(trainer: Trainer) -> None:
    """Which object (datamodule or model) runs each batch-transfer hook, decided now: Lightning asks again at each of
    a batch's three hooks (six ``is_overridden`` calls a step: host time, docs/benchmarks.md). Its warnings come out
    here. Not where this Lightning's selector differs (``check_supported``)."""
    if BATCH_HOOKS in unfit(trainer):
        return
    selector = trainer._data_connector._datahook_selector  # set by fit's attach_data
    owners = {hook: selector.get_instance(hook) for hook in selector._valid_hooks}
    selector.get_instance = owners.__getitem__


_LIGHTNING_DISPATCH = call._call_callback_hooks
_PLANS: "WeakKeyDictionary[Trainer, dict]" = WeakKeyDictionary()  # trainer -> {(hook, monitoring): [(callback, label)]}


def call_only_overridden_hooks(trainer: Trainer, on: bool = True) -> None:
    """Lightning's dispatch of ``trainer``'s callback hooks without the callbacks that leave a hook as
    ``Callback``'s no-op: each costs a profiler context and a state key per hook, ~150 µs a step for 20 callbacks
    (docs/benchmarks.md). The others run as Lightning runs them: in order, under the same profiler label. Lightning's
    own dispatch where its differs (``check_supported``)."""
    if not on:
        _PLANS.pop(trainer, None)
    elif DISPATCH not in unfit(trainer):
        call._call_callback_hooks = _call_overridden_hooks
        _PLANS[trainer] = {}


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
    steps = getattr(checkpoint, "_every_n_train_steps", None)  # not there: Lightning's hook decides
    return not isinstance(steps, int) or steps >= 1 or getattr(checkpoint, "_train_time_interval", _UNUSED) is not None


def collective_timeout(strategy) -> Optional[timedelta]:
    """The timeout a ddp/fsdp strategy hands its process group (None: a strategy of one process)."""
    return getattr(strategy, "_timeout", None)


def between_optimizer_steps(trainer: Trainer) -> bool:
    """After a batch whose gradients wait for the next one (``accumulate_grad_batches`` > 1)."""
    return trainer.accumulate_grad_batches > 1 and trainer.fit_loop.epoch_loop._should_accumulate()


def recreate_train_iterator(trainer: Trainer) -> None:
    """Create the epoch's data iterator again, drawing its base seed as an uninterrupted run did (at an epoch's start:
    the fit loop's setup_data made the fetcher)."""
    iter(trainer.fit_loop._data_fetcher)


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
    strategy._ddp_comm_hook, strategy._ddp_comm_state = hook, state  # unread if renamed: ``check_supported`` says so


def fsdp_collectives(module) -> tuple:
    """An FSDP2 module's all-gather and reduce-scatter (no getter), with one parameter group; else (None, None)."""
    state = getattr(module, "_get_fsdp_state", lambda: None)()  # missing or not in torch 2.7: ``check_supported``
    groups = getattr(state, "_fsdp_param_groups", ())
    comms = tuple(getattr(groups[0], name, None) for name in ("_all_gather_comm", "_reduce_scatter_comm")) if len(
        groups) == 1 else (None, None)
    return comms if None not in comms else (None, None)


def launched_children(trainer: Trainer, release: bool = False) -> List[Any]:
    """The rank processes Lightning's launcher started from this process (none in a rank it started); ``release``:
    out of sight of Lightning's observer from now on (it SIGKILLs the launcher on a failed rank)."""
    procs = getattr(trainer.strategy.launcher, "procs", None)  # the launcher may be None
    children = list(procs) if isinstance(procs, list) else []
    if release and children:
        procs.clear()
    return children


class CheckpointHparamsOurs(LightningCLI):
    """LightningCLI without its merge of a checkpoint's hyperparameters over the parsed flags (an unverified second
    read): the CLI builds that config in layers itself (fashion_mnist_dp/cli/checkpoint_hparams.py)."""

    def _parse_ckpt_path(self) -> None:
        pass


def public_hparams(params: Dict[str, Any]) -> Dict[str, Any]:
    """Without ``_instantiator``: LightningCLI stores it in hparams; not a hyperparameter."""
    return {key: value for key, value in params.items() if key != "_instantiator"}


def run_exit_handlers() -> None:
    """Run the atexit handlers now, as the interpreter's exit would first: for a rank that then leaves with
    ``os._exit`` (lifetime.exit_process): CPython's private ``atexit._run_exitfuncs``."""
    atexit._run_exitfuncs()
