"""Every access to a private attribute of Lightning, LightningCLI or jsonargparse, and of CPython's atexit, and nothing
else: only those a guarantee needs and no public API serves, each with the public API it waits for. Each is checked
where it runs (``check_supported``): a mismatch ends a run whose guarantee depends on it in one line, or turns off
what it serves, and the start block says so (docs/reliability.md, "Supported versions"); tests/unit/test_compat.py
checks them against the installed versions."""

import atexit
import importlib
import inspect
from typing import Any, Dict, List, Union

import jsonargparse
import lightning
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import ModelParallelStrategy
from packaging.version import Version

SUPPORTED = "Lightning 2.5.0 to 2.6.6 with torch 2.6.0 to 2.15.0"  # CI's two legs (docs/testing.md)
SIGTERM_BROADCAST = "Lightning's per-step SIGTERM broadcast off"
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
    """(whether a guarantee depends on it, what it serves, owner, attribute, shape) of each access this run makes; the
    public API each waits for is beside it (docs/reliability.md, "Supported versions")."""
    strategy, loop, launcher = trainer.strategy, trainer.fit_loop, trainer.strategy.launcher
    only = lambda used, owner: owner if used else _UNUSED  # noqa: E731
    fsdp = isinstance(strategy, ModelParallelStrategy)
    return [
        # waits for: a Trainer switch that leaves the process's signal handlers to the caller
        (True, "Preemption's signal handling (runtime/signals.py)", _reach(trainer, "_signal_connector"),
         "register_signal_handlers", _takes()),
        # waits for: whether the last batch stepped the optimizer, on the loop's public face
        (True, "a stop between accumulated batches", loop.epoch_loop, "_should_accumulate", _takes()),
        # waits for: a way to draw an epoch's iterator again after a restore
        (True, "exact resume", loop, "_data_fetcher", None),
        # waits for: a LightningCLI switch that leaves a checkpoint's hyperparameters unread (added in 2.5.5)
        (True, "the user's flags over a checkpoint's settings", only(
            Version(lightning.__version__) >= Version("2.5.5"), LightningCLI), "_parse_ckpt_path", _takes("self")),
        # waits for: the launcher's processes (their exit codes) on its public face
        (True, "a failed rank's exit code", only(launcher is not None, launcher), "procs",
         lambda procs: isinstance(procs, list)),
        # waits for: ModelParallelStrategy's mesh sizes as public properties
        (True, "fsdp's mesh of every rank", only(fsdp, strategy), "_data_parallel_size", None),
        (True, "fsdp's mesh of every rank", only(fsdp, strategy), "_tensor_parallel_size", None),
        # waits for: a switch for the loop's per-batch broadcast of its SIGTERM flag (added in 2.5.2): else a
        # collective of every step
        (False, SIGTERM_BROADCAST, only(Version(lightning.__version__) >= Version("2.5.2"), loop.epoch_loop),
         "_broadcast_sigterm_tensor", _takes()),
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


def batch_limits_count_first(parser) -> None:
    """``limit_*_batches``: a whole number is a count (jsonargparse tried float first: ``1`` meant every batch). Waits
    for: Lightning's signature putting ``int`` first, or jsonargparse reading a union's types in the order given."""
    limits = {f"trainer.limit_{stage}_batches" for stage in ("train", "val", "test", "predict")}
    for action in parser._actions:
        if action.dest in limits:
            if not hasattr(action, "_typehint"):
                raise MisconfigurationException(f"--{action.dest} as a count relies on jsonargparse's "
                                                f"ActionTypeHint._typehint, which jsonargparse "
                                                f"{jsonargparse.__version__} lacks: install 4.51.0 to 4.53.0")
            action._typehint = Union[int, float, None]


def no_checkpoint_on_exception(trainer: Trainer) -> None:
    """Switch off the checkpoint-on-exception callbacks for the exception being handled (this trainer only)."""
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and getattr(callback, "save_on_exception", False):
            callback.save_on_exception = False
        elif isinstance(callback, OnExceptionCheckpoint):
            callback.on_exception = lambda *args, **kwargs: None  # this instance only


def between_optimizer_steps(trainer: Trainer) -> bool:
    """After a batch whose gradients wait for the next one (``accumulate_grad_batches`` > 1)."""
    return trainer.accumulate_grad_batches > 1 and trainer.fit_loop.epoch_loop._should_accumulate()


def recreate_train_iterator(trainer: Trainer) -> None:
    """Create the epoch's data iterator again, drawing its base seed as an uninterrupted run did (at an epoch's start:
    the fit loop's setup_data made the fetcher)."""
    iter(trainer.fit_loop._data_fetcher)


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


def run_exit_handlers() -> None:
    """Run the atexit handlers now, as the interpreter's exit would first: for a rank that then leaves with
    ``os._exit`` (lifetime.exit_process): CPython's private ``atexit._run_exitfuncs``. Waits for: a process group that
    tears down without racing its peers' exits (pytorch/pytorch#190489)."""
    atexit._run_exitfuncs()
