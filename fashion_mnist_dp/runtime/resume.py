"""Resume: which checkpoint ``--ckpt_path`` means, whether anything is left to train, and what Lightning does not put
back (the generators' state, the TensorBoard run): docs/reliability.md, "Exact resume"."""

import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import Strategy

from fashion_mnist_dp.runtime import checkpoint_io, compat
from fashion_mnist_dp.runtime.errors import CheckpointError, NothingToTrain, one_line


@dataclass(frozen=True)
class Resume:
    """What ``--ckpt_path`` resolved to: the file (None: a new run), whether its TensorBoard run continues, rank 0's
    lines, and the checkpoint once the CLI has read and verified it (read once)."""

    path: Optional[str] = None
    continue_run: bool = False
    lines: Tuple[str, ...] = ()
    checkpoint: Optional[dict] = field(default=None, compare=False, repr=False)


def resolve(ckpt_path: Optional[str], folders: Sequence, restarts: int = 0, attempt: int = 1,
            root: Optional[str] = None) -> Resume:
    """``--ckpt_path`` as a file, or a new run (docs/reliability.md, "Checkpoints" and "torchrun restarts");
    ``folders``: the run's checkpoint folders; ``root``: the default_root_dir, where ``hpc`` looks and whose other
    experiments with a last checkpoint ``last`` names when it finds none in ``folders``."""
    if not ckpt_path or checkpoint_io.is_remote(ckpt_path) or ckpt_path.split(":")[0] == "registry":
        return Resume(ckpt_path or None)
    if ckpt_path == "hpc":  # as Lightning resolves it (the largest N), then checked below like any other file
        numbered = {path.stem.removeprefix("hpc_ckpt_"): path for path in Path(root).glob("hpc_ckpt_*.ckpt")}
        found = {int(number): path for number, path in numbered.items() if number.isdigit()}
        if not found:
            raise CheckpointError(f"--ckpt_path hpc: no hpc_ckpt_N.ckpt in {Path(root).absolute()} (the "
                                  f"default_root_dir, where SLURM requeues save them); give a .ckpt file instead")
        ckpt_path = str(found[max(found)].absolute())
    where = ", ".join(str(f) for f in folders) or "the checkpoint folder"
    if ckpt_path == "best":
        files = sorted(str(p) for f in folders for p in Path(f).glob("*.ckpt") if not p.name.startswith("last"))
        examples = f"; found: {', '.join(files[:3])}" if files else ""
        raise CheckpointError(
            f"--ckpt_path best means the best checkpoint of this process's own fit, which a new run does not have "
            f"yet; give the file instead (--ckpt_path FILE){examples}")
    if ckpt_path != "last":
        if not Path(ckpt_path).is_file():
            raise CheckpointError(f"checkpoint not found: {ckpt_path}; give an existing .ckpt file, or "
                                  f"--ckpt_path last")
        return Resume(ckpt_path)
    last_files = {path for folder in folders for path in Path(folder).glob("last*.ckpt")}  # Lightning's last ones
    if not last_files and restarts > 0:
        return Resume(None, lines=(f"--ckpt_path last: no last checkpoint in {where} yet: starting a new run "
                                   f"(torchrun attempt {attempt} of {restarts + 1})",))
    if not last_files:
        mine = {Path(folder) for folder in folders}
        experiments = Path(root).absolute().glob("*/checkpoints") if root is not None else ()
        elsewhere = sorted(str(f) for f in experiments if f not in mine and any(f.glob("last*.ckpt")))
        others = (f"; other experiments have one ({', '.join(elsewhere)}): the folder is named by the run's network, "
                  f"strategy, devices, batch and optimizer, so resume one with the flags it ran with"
                  if elsewhere else "")
        raise CheckpointError(
            f"--ckpt_path last: no last checkpoint (last*.ckpt) in {where}, so there is nothing to resume (Lightning "
            f"would only warn and start from scratch); drop --ckpt_path to start a new run, or give a .ckpt file"
            f"{others}")
    chosen, rejected = checkpoint_io.newest_valid(last_files)
    if chosen is None:
        others = {p for f in folders for p in Path(f).glob("*.ckpt")} - last_files
        chosen, more = checkpoint_io.newest_valid(others)
        rejected += more
    if chosen is None:
        raise CheckpointError.damaged(", ".join(e.path for e in rejected), "--ckpt_path last found no valid "
                                      "checkpoint: " + "; ".join(e.reason for e in rejected))
    lines = tuple(f"warning: {one_line(e)}; skipped" for e in rejected)
    if rejected:
        lines += (f"warning: --ckpt_path last resumes from {chosen}, the newest valid checkpoint",)
    return Resume(str(chosen), continue_run=True, lines=lines)


def finished_training(checkpoint: dict, max_epochs: Optional[int], max_steps: Optional[int]) -> Optional[str]:
    """Why ``checkpoint`` has nothing left to train under these limits, or None."""
    loops = checkpoint.get("loops") or {}
    epochs = loops.get("fit_loop", {}).get("epoch_progress", {}).get("current", {}).get("processed")
    steps = checkpoint.get("global_step", 0)
    if max_steps is not None and max_steps > 0 and steps >= max_steps:
        return f"has finished training: {steps} optimizer steps trained, --trainer.max_steps {max_steps}"
    if max_epochs is not None and max_epochs > 0 and epochs is not None and epochs >= max_epochs:
        return f"has finished training: {epochs} epoch(s) trained, --epochs {max_epochs}"
    return None


# ------------------------------------------------------------------ random generators


def capture() -> Dict[str, Any]:
    """torch's, numpy's and Python's generator state as tensors, ints and tuples (loads with weights_only=True)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (str(kind), torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RngState(Callback):
    """The generators' state in every checkpoint, restored where the uninterrupted run had it (docs/reliability.md)."""

    def __init__(self) -> None:
        self._pending: Optional[Dict[str, Any]] = None

    def state_dict(self) -> Dict[str, Any]:
        return capture()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._pending = state_dict

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The epoch's iterator is created again after the restore: it drew its base seed before."""
        if self._pending is not None:
            restore(self._pending)
            self._pending = None
            if trainer.current_epoch > 0:
                compat.recreate_train_iterator(trainer)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if self._pending is not None:  # resumed mid-epoch: Lightning skips on_train_epoch_start
            restore(self._pending)
            self._pending = None


# ------------------------------------------------------------------ TensorBoard run folders


class TensorBoardRun(Callback):
    """Saves the first TensorBoard logger's run folder (absolute root and version) with every checkpoint."""

    def __init__(self) -> None:
        self._logger: Optional[TensorBoardLogger] = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._logger = next((logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)), None)

    def state_dict(self) -> Dict[str, Any]:
        return {} if self._logger is None else {"root": os.path.abspath(self._logger.root_dir),
                                                       "version": self._logger.version}


# ------------------------------------------------------------------ for one trainer


def prepare(trainer: Trainer, subcommand: str, resumed: Resume) -> None:
    """Before launch: rank 0 prints the resolution's lines; a finished fit raises NothingToTrain; Lightning's restore
    is handed the checkpoint the CLI read (unless the strategy reads the file itself: fsdp), so it is read once."""
    if trainer.is_global_zero:
        for line in resumed.lines:
            print(f"train.py: {line}", file=sys.stderr, flush=True)
    checkpoint, io = resumed.checkpoint, trainer.strategy.checkpoint_io
    done = finished_training(checkpoint, trainer.max_epochs, trainer.max_steps) if checkpoint and subcommand == "fit" \
        else None
    if done:
        raise NothingToTrain(f"{resumed.path} {done}; nothing to train (raise --epochs to train on)")
    if checkpoint is not None and isinstance(io, checkpoint_io.VerifiedCheckpointIO) and \
            type(trainer.strategy).load_checkpoint is Strategy.load_checkpoint:
        io.hand_over(resumed.path, checkpoint)
