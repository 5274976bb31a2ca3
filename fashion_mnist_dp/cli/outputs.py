"""Where a run's files go, decided from its parsed config before anything is built: the run's name, its log and
checkpoint folders (docs/reporting.md, "Where")."""

import inspect
import os
import re
from pathlib import Path
from typing import Any, List, Optional, Tuple

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from fashion_mnist_dp.cli.checks import import_class, parse_devices, resolved_accelerator
from fashion_mnist_dp.cli.shorthand import SHORT_NAME

DEFAULT_ROOT = "runs"


def short_name(class_path: Optional[str]) -> str:
    """The command line's short name of a network or optimizer class (``fast_cnn``, ``lamb``), else its class name."""
    return SHORT_NAME.get(class_path) or str(class_path).rpartition(".")[2].lower()


def device_count(devices: Any, accelerator: Any) -> int:
    """How many devices ``--devices`` means on this node (``auto``: 1 on CPU, every GPU on CUDA)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    parsed = parse_devices(devices)
    if isinstance(parsed, list):
        return len(parsed)
    if parsed in ("auto", -1):
        return gpus if resolved_accelerator(accelerator) == "cuda" and gpus else 1
    return max(int(parsed), 1)


def strategy_name(strategy: Any, devices: int) -> str:
    """``ddp``, ``fsdp``, ``dp``...; ``auto`` is what Lightning makes of it: one device ``single``, several ``ddp``."""
    if isinstance(strategy, str):
        name = strategy.lower()
        if name == "auto":
            return "single" if devices == 1 else "ddp"
        return "fsdp" if name.startswith("fsdp") else name
    class_path = getattr(strategy, "class_path", None) or type(strategy).__name__
    name = str(class_path).rpartition(".")[2].removesuffix("Strategy")
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower() or "custom"


def run_name(config) -> str:
    """``<network>-<strategy>-<devices>x<batch>-<optimizer>``, e.g. ``cnn-ddp-4x128-sgd`` (virtual: ``8vx128``)."""
    trainer, model, data = config.trainer, config.model, config.data
    devices = device_count(trainer.devices, trainer.accelerator) * int(trainer.num_nodes or 1)
    virtual = int(getattr(data, "virtual_devices", 1) or 1)
    shape = f"{devices * virtual}vx{data.batch_size}" if virtual > 1 else f"{devices}x{data.batch_size}"
    network = short_name(getattr(model.network, "class_path", None))
    optimizer = short_name(getattr(model.optimizer, "class_path", None))
    return f"{network}-{strategy_name(trainer.strategy, devices)}-{shape}-{optimizer}"


def _entries(value: Any, kind: type) -> List[Tuple[int, Any]]:
    """(index, entry) of each entry of a parsed list or single class (``trainer.callbacks``) of a ``kind``."""
    entries = value if isinstance(value, list) else [value]
    return [(index, entry) for index, entry in enumerate(entries)
            if isinstance(found := import_class(getattr(entry, "class_path", None)), type) and issubclass(found, kind)]


def fill_output_paths(config) -> List[Tuple[str, int, str]]:
    """Fill in the null ``default_root_dir``, ModelCheckpoint ``dirpath`` and TensorBoard ``save_dir`` and ``name``;
    returns what it filled (list key, index, argument), which config.yaml keeps null (:func:`as_given`)."""
    trainer, filled = config.trainer, []
    if trainer.default_root_dir is None:
        trainer.default_root_dir = DEFAULT_ROOT
    name = run_name(config)
    for index, entry in _entries(trainer.callbacks or [], ModelCheckpoint):
        if entry.init_args.dirpath is None:
            entry.init_args.dirpath = str(Path(trainer.default_root_dir) / name / "checkpoints")
            filled.append(("trainer.callbacks", index, "dirpath"))
    for index, entry in _entries(trainer.logger, TensorBoardLogger):
        for argument, value in (("save_dir", str(trainer.default_root_dir)), ("name", name)):
            if entry.init_args.get(argument) is None:
                entry.init_args[argument] = value
                filled.append(("trainer.logger", index, argument))
    return filled


def tensorboard_runs(config, checkpoint: Optional[dict]) -> List[Tuple[str, Optional[int], str]]:
    """For a fit: each TensorBoard logger that takes ``purge_step`` continues the ``checkpoint``'s run folder when it
    is its own, else opens a new run purged from step 0 (docs/reliability.md, "TensorBoard after a resume"); what it
    filled, for :func:`as_given`."""
    run = ((checkpoint or {}).get("callbacks") or {}).get("TensorBoardRun") or {}
    step = int((checkpoint or {}).get("global_step", 0))
    filled: List[Tuple[str, Optional[int], str]] = []
    for index, entry in _entries(config.trainer.logger, TensorBoardLogger):
        args = entry.init_args
        if "purge_step" not in inspect.signature(import_class(entry.class_path)).parameters:
            continue
        ours = run.get("root") == os.path.abspath(os.path.join(args.save_dir, args.name or ""))
        if args.get("version") is None and run.get("version") is not None and ours:
            args.version, args.purge_step = run["version"], step
            filled += [("trainer.logger", index, "version"), ("trainer.logger", index, "purge_step")]
        elif args.get("purge_step") is None:
            args.purge_step = 0
            filled.append(("trainer.logger", index, "purge_step"))
    return filled


def as_given(config, filled: List[Tuple[str, Optional[int], str]]):
    """A copy of ``config`` with the values train.py derived (``filled``) back to null."""
    given = config.clone()
    for key, index, argument in filled:
        entries = given[key] if isinstance(given[key], list) else [given[key]]
        section = given[key] if index is None else entries[index].init_args  # None: a plain section (data)
        section[argument] = None
    return given


def checkpoint_folders(config) -> List[str]:
    """The folders ``--ckpt_path last`` searches: every ModelCheckpoint's, absolute (as Lightning's own)."""
    entries = _entries(config.trainer.callbacks or [], ModelCheckpoint)
    return sorted({str(Path(entry.init_args.dirpath).absolute()) for _, entry in entries if entry.init_args.dirpath})

