"""Where a run's files go, decided from its parsed config before anything is built: the experiment's folder (what
ran), the run's name where it is known, its TensorBoard continuation (docs/cli.md, "Where a run's files go")."""

import inspect
import re
from pathlib import Path
from typing import Any, List, Optional, Tuple

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from fashion_mnist_dp.cli.checks import import_class, parse_devices, resolved_accelerator
from fashion_mnist_dp.cli.shorthand import SHORT_NAME
from fashion_mnist_dp.runtime.errors import ConfigError

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


def experiment_name(config) -> str:
    """What ran, as the command gave it: ``<network>-<strategy>-batch<B>-<optimizer>``, e.g. ``cnn-ddp-batch128-sgd``.
    Not the devices: a run resumed on another number (a requeue onto fewer nodes) stays in its experiment."""
    model, strategy = config.model, config.trainer.strategy
    named = strategy.lower() if isinstance(strategy, str) else strategy_name(strategy, 0)
    network = short_name(getattr(model.network, "class_path", None))
    optimizer = short_name(getattr(model.optimizer, "class_path", None))
    return f"{network}-{'fsdp' if named.startswith('fsdp') else named}-batch{config.data.batch_size}-{optimizer}"


def legacy_experiment_name(config) -> str:
    """The folder every run of an experiment shared before runs had folders of their own:
    ``<network>-<strategy>-<devices>x<batch>-<optimizer>`` (``--ckpt_path last`` still finds its last checkpoint)."""
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


def given_run_name(config) -> Optional[str]:
    """The run's name as the user gave it: ``--run_name``, else the first TensorBoard logger's ``version`` (text)."""
    versions = [entry.init_args.get("version") for _, entry in _entries(config.trainer.logger, TensorBoardLogger)]
    version = next((v for v in versions if v is not None), None)
    if config.get("run_name") is not None and version is not None and str(version) != config.run_name:
        raise ConfigError(f"--run_name {config.run_name} and the logger's version {version} name the run twice; give "
                          f"one of them")
    return config.get("run_name") or (None if version is None else str(version))


def fill_output_paths(config, run: Optional[str] = None) -> List[Tuple[str, int, str]]:
    """Fill in the null ``default_root_dir`` and TensorBoard ``save_dir``, ``name`` (the experiment) and ``version``
    (``run``, where it is known before launch); returns what it filled (list key, index, argument), which config.yaml
    keeps null (:func:`as_given`). A ModelCheckpoint's null ``dirpath`` is the run folder's, set by rank 0 (app.py)."""
    trainer, filled = config.trainer, []
    if trainer.default_root_dir is None:
        trainer.default_root_dir = DEFAULT_ROOT
    values = (("save_dir", str(trainer.default_root_dir)), ("name", experiment_name(config)), ("version", run))
    for index, entry in _entries(trainer.logger, TensorBoardLogger):
        for argument, value in values:
            if entry.init_args.get(argument) is None and value is not None:
                entry.init_args[argument] = value
                filled.append(("trainer.logger", index, argument))
    return filled


def root_folder(config) -> Path:
    """``default_root_dir``, where every experiment's folder is ("": the working directory)."""
    root = config.trainer.default_root_dir
    return Path(DEFAULT_ROOT if root is None else root or ".")


def tensorboard_runs(config, continued: bool, step: int) -> List[Tuple[str, Optional[int], str]]:
    """For a fit: each TensorBoard logger that takes ``purge_step`` continues a ``continued`` run folder from the
    checkpoint's ``step`` (TensorBoard drops what the run logged from there on: docs/reliability.md, "TensorBoard after
    a resume"), else starts its new one purged from step 0; what it filled, for :func:`as_given`."""
    filled: List[Tuple[str, Optional[int], str]] = []
    for index, entry in _entries(config.trainer.logger, TensorBoardLogger):
        args = entry.init_args
        if "purge_step" in inspect.signature(import_class(entry.class_path)).parameters and \
                args.get("purge_step") is None:
            args.purge_step = step if continued else 0
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
    """The folders ``--ckpt_path last`` searches instead of the experiment's runs, absolute: those a config gave every
    ModelCheckpoint by hand (``dirpath``); none when one keeps its run folder's (a null ``dirpath``)."""
    folders = [entry.init_args.dirpath for _, entry in _entries(config.trainer.callbacks or [], ModelCheckpoint)]
    return [] if None in folders else sorted({str(Path(folder).absolute()) for folder in folders})
