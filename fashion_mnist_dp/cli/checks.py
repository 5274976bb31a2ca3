"""Pre-launch checks of values Lightning accepts but cannot run, each one line (docs/reliability.md, "Bad input")."""

import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from callbacks.flops import peak_refusal
from fashion_mnist_dp.cli.shorthand import SHORT_NAME
from fashion_mnist_dp.cli.slurm import check_slurm_layout, rendezvous_environment_problem
from fashion_mnist_dp.runtime.errors import CantWriteError, ConfigError, JobFault
from fashion_mnist_dp.runtime.lifetime import is_launched_rank
from fashion_mnist_dp.runtime.runs import NAME_LIMIT, name_problem
from fashion_mnist_dp.strategies import CPU_NAME, is_fsdp, require_gpus, unshardable_optimizer

DEVICES_KEY = "trainer.devices (--devices)"
# How a launcher (torchrun, srun, or variables set by hand) tells a process its place among nodes.
LAUNCHER_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK")


def parse_devices(devices: Union[int, str, Sequence[int], None]):
    """``int``, ``"auto"``, or a list of GPU indices, from what the config holds: a number, a list, or either as text
    (a list's text, ``[0, 1]``, reads as ``0,1`` does)."""
    text = "auto" if devices is None else str(devices).strip()
    if text == "auto":
        return "auto"
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return [int(p) for p in text.strip("[]").split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"{DEVICES_KEY} is {devices!r}: give a number, auto, -1 or a list of GPU indices") from None


def import_class(class_path: Optional[str]) -> Optional[type]:
    """The class a config's class path names (already imported by jsonargparse), else None."""
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module, _, name = class_path.rpartition(".")  # as jsonargparse reads it: pkg.Foo is pkg's Foo, module or not
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


CPU_RANKS_PER_CORE = 8  # beyond this many CPU processes per core a run only thrashes


def check_devices(devices, accelerator: str, cpu_count: Optional[int], gpu_count: int) -> Optional[str]:
    """Refuses what this machine cannot serve; returns the warning for more CPU processes than cores (allowed)."""
    parsed = parse_devices(devices)
    if parsed == "auto":
        return None
    if accelerator == "cpu":
        cores = cpu_count or 1
        most = CPU_RANKS_PER_CORE * cores
        allowed = f"give a number of CPU processes from 1 to {most} ({CPU_RANKS_PER_CORE} per core), or auto (1)"
        if isinstance(parsed, list) or parsed == -1:
            given = f"{devices!r}, a list of GPU indices" if isinstance(parsed, list) else "-1 (every GPU)"
            raise ConfigError(f"{DEVICES_KEY} is {given}, but the accelerator is cpu: {allowed}")
        if parsed <= 0:
            raise ConfigError(f"{DEVICES_KEY} is {parsed}: {allowed}")
        if parsed > most:
            raise ConfigError(
                f"{DEVICES_KEY} is {parsed}, more than {CPU_RANKS_PER_CORE} CPU processes per core (this machine has "
                f"{cores}): {allowed}; for more ranks use more nodes (--num_nodes) or GPUs (--accelerator gpu)")
        if parsed > cores:
            return (f"--devices {parsed} starts more CPU processes than this machine has cores ({cores}): the ranks "
                    f"share the cores, one thread each, so images/sec will not scale")
        return None
    if accelerator == "cuda" and gpu_count > 0:
        visible = f"{gpu_count} visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        allowed = f"give 1 to {gpu_count}, -1 or auto (every visible GPU), or GPU indices from 0 to {gpu_count - 1}"
        if isinstance(parsed, list):
            if not parsed or len(set(parsed)) != len(parsed) or not all(0 <= d < gpu_count for d in parsed):
                raise ConfigError(f"{DEVICES_KEY} is {devices!r}: GPU indices must be distinct and visible, {visible}: "
                                  f"{allowed}")
        elif parsed == 0 or parsed < -1:
            raise ConfigError(f"{DEVICES_KEY} is {parsed}: {allowed}")
        elif parsed > gpu_count:
            raise ConfigError(f"{DEVICES_KEY} is {parsed}, more GPUs than are visible: {visible}; {allowed}")


def resolved_accelerator(accelerator) -> Optional[str]:
    """``cpu``, ``cuda``, ``mps``... as Lightning will choose it; None for an Accelerator object."""
    if not isinstance(accelerator, str):
        return None
    cuda = torch.cuda.is_available()
    accelerator = accelerator.lower()
    if accelerator == "auto":
        return "cuda" if cuda else "mps" if torch.backends.mps.is_available() else "cpu"
    return "cuda" if accelerator == "gpu" and cuda else accelerator


# Trainer keys Lightning takes as any int but cannot run below a least value: (key, least, what to give).
WHOLE_NUMBERS = (
    ("accumulate_grad_batches", 1, "a whole number >= 1 (1: every batch is one step)"),  # 0 divides by zero
    ("check_val_every_n_epoch", 1, "a whole number of epochs >= 1, or null to validate every "  # 0 divides by zero
                                   "trainer.val_check_interval batches"),
    ("num_sanity_val_steps", -1, "a number of batches >= 0, or -1 for every validation batch"),  # < -1: skipped
    ("log_every_n_steps", 1, "a number of optimizer steps >= 1"),  # < 1: Lightning trains on as if it were fine
)
SEED_LIMIT = 2**32 - 1  # numpy's: seed_everything seeds it too


def check_run_values(config) -> None:
    """The run's seed and name, before LightningCLI seeds (numpy raised a traceback out of its range) or the name is
    a folder."""
    seed = config.get("seed_everything")
    if not isinstance(seed, bool) and isinstance(seed, int) and not 0 <= seed <= SEED_LIMIT:
        raise ConfigError(f"seed_everything (--seed) is {seed}: give a whole number from 0 to {SEED_LIMIT}, true for "
                          f"a random one, or false for none")
    name = config.get("run_name")
    if name is not None and (problem := name_problem(name)):
        raise ConfigError(f"--run_name {name!r} {problem}: give a folder name of at most {NAME_LIMIT} characters, "
                          f"without / or \\, not starting with a dot")


def check_config(config) -> None:
    """The subcommand's parsed config: what would fail late or silently."""
    trainer = config.trainer
    max_epochs = trainer.max_epochs
    if max_epochs is not None and (max_epochs == 0 or max_epochs < -1):
        raise ConfigError(f"trainer.max_epochs (--epochs) must be >= 1, or -1 for no limit; got {max_epochs}")
    accelerator = resolved_accelerator(trainer.accelerator)
    if str(trainer.strategy).lower() == "dp":
        require_gpus()  # here too: building the Trainer prints Lightning's srun warning before dp's own check
    elif accelerator in ("cpu", "cuda"):
        warning = check_devices(trainer.devices, accelerator, os.cpu_count(),
                                torch.cuda.device_count() if torch.cuda.is_available() else 0)
        if warning and not is_launched_rank():  # the launching process says it once
            print(f"train.py: warning: {warning}", file=sys.stderr, flush=True)
    if trainer.strategy == "fsdp" and accelerator == "cpu":
        trainer.strategy = CPU_NAME  # the same FSDP2 strategy: Lightning refuses the name fsdp on CPU
    optimizer = getattr(config.model.optimizer, "class_path", None)
    if is_fsdp(trainer.strategy) and unshardable_optimizer(import_class(optimizer)):
        raise ConfigError(f"--optimizer {SHORT_NAME.get(optimizer, optimizer)} keeps a plain tensor beside fsdp's "
                          f"sharded parameters, which torch refuses; use --strategy ddp with it, or "
                          f"lamb/lars/sgd/adamw with fsdp")
    if is_fsdp(trainer.strategy) and accelerator == "cpu" and not hasattr(torch.cpu.Stream, "record_event"):
        raise ConfigError(f"--strategy fsdp on CPU needs torch >= 2.7 (its CPU streams), this is torch "
                          f"{torch.__version__}: use --strategy ddp on CPU, or fsdp on GPUs")
    for key, least, advice in WHOLE_NUMBERS:
        value = trainer[key]
        if value is not None and (type(value) is not int or value < least):
            raise ConfigError(f"trainer.{key} is {value!r}: give {advice}")
    # Lightning refuses < 0 and a fraction > 1.0 itself; 0 divides by zero (int) or never validates (float)
    if type(trainer.val_check_interval) in (int, float) and trainer.val_check_interval == 0:
        raise ConfigError(f"trainer.val_check_interval is {trainer.val_check_interval}: give a whole number of batches "
                          f">= 1, or a fraction of the epoch in (0.0, 1.0]")
    clip = trainer.gradient_clip_val
    if clip is not None and not (isinstance(clip, (int, float)) and clip >= 0):
        raise ConfigError(f"trainer.gradient_clip_val is {clip!r}: give a norm >= 0 (0 or unset: no clipping)")
    if (refusal := peak_refusal(config.get("peak_flops"))) is not None:
        raise ConfigError(refusal)
    nodes = trainer.num_nodes or 1
    if slurm_mismatch := check_slurm_layout(os.environ, parse_devices(trainer.devices), nodes):
        raise ConfigError(slurm_mismatch)
    if problem := rendezvous_environment_problem(os.environ, gloo=accelerator == "cpu"):
        line, network = problem
        raise JobFault(line) if network else ConfigError(line)
    if nodes > 1 and not any(name in os.environ for name in LAUNCHER_VARIABLES):
        raise ConfigError(f"--num_nodes {nodes} needs a launcher on every node to tell each process its rank: run "
                          f"'torchrun --nnodes {nodes} --nproc-per-node DEVICES --node-rank I --master-addr NODE0 "
                          f"--master-port 29500 train.py ... --num_nodes {nodes}' on node I, or 'srun python train.py "
                          f"...' under SLURM (README, \"Several machines\")")


def unwritable_reason(folder: Union[str, Path, None]) -> Optional[str]:
    """Why ``folder`` cannot be created or written, else None: the nearest existing folder is tried with a temporary
    folder, removed at once (file modes alone do not tell, e.g. for root)."""
    if folder is None or "://" in str(folder):  # none given, or s3://, memory://...: left to fsspec
        return None
    path = Path(folder).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())  # "/" at the latest
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=existing))
    except OSError as error:
        return f"{existing} is not writable ({error.strerror or error})"
    return None


def check_outputs(trainer, subcommand: str) -> None:
    """The run's, the loggers' and (fit) the checkpoint folders can be created and written; nothing is created."""
    folders = [("trainer.default_root_dir", trainer.default_root_dir)]
    folders += [("trainer.logger.init_args.save_dir", getattr(logger, "save_dir", None)) for logger in trainer.loggers]
    if subcommand == "fit":
        folders += [("ModelCheckpoint dirpath (trainer.callbacks)", getattr(callback, "dirpath", None))
                    for callback in trainer.checkpoint_callbacks]
    for key, folder in folders:
        if (reason := unwritable_reason(folder)) is not None:
            raise CantWriteError(f"{key} is {folder}, which cannot be written: {reason}; give a writable folder "
                                 f"(--trainer.default_root_dir: logs and checkpoints go under it)")
