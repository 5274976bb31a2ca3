"""Resume: which checkpoint ``--ckpt_path`` means (``last``: which run), whether anything is left to train, and what
Lightning does not put back (the generators' state): docs/reliability.md, "Exact resume"."""

import dataclasses
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import Strategy

from fashion_mnist_dp.runtime import checkpoint_io, compat, runs
from fashion_mnist_dp.runtime.errors import CheckpointError, ConfigError, NothingToTrain, one_line


@dataclass(frozen=True)
class Resume:
    """What ``--ckpt_path`` resolved to: the file (None: nothing to load); the run folder this process writes to when
    it is known before launch (``continued``: an existing run's, else a name given for a new one; None: a new folder
    rank 0 makes, :func:`runs.claim`); why (the start block's ``run`` line); rank 0's lines; and the checkpoint once
    the CLI has read and verified it (read once). ``newest``: chosen as the experiment's newest run, which a running
    run of another job makes ambiguous (rank 0 checks before launch)."""

    path: Optional[str] = None
    run: Optional[str] = None
    continued: bool = False
    why: str = "new"
    lines: Tuple[str, ...] = ()
    newest: bool = False
    checkpoint: Optional[dict] = field(default=None, compare=False, repr=False)


def resolve(ckpt_path: Optional[str], folders: Sequence, restarts: int = 0, attempt: int = 1,
            root: Optional[str] = None, experiment: Optional[Path] = None, run_name: Optional[str] = None,
            legacy: Optional[Path] = None, environ: Mapping[str, str] = os.environ) -> Resume:
    """``--ckpt_path`` as a file, or a new run (docs/cli.md, "Where a run's files go"; docs/reliability.md,
    "torchrun restarts"). ``experiment``: the experiment's folder, whose runs ``last`` chooses from (``legacy``: its
    folder before runs had their own); ``folders``: checkpoint folders a config gave by hand, searched instead;
    ``root``: the default_root_dir, where ``hpc`` looks."""
    new = Resume(None, run_name)
    if not ckpt_path or checkpoint_io.is_remote(ckpt_path) or ckpt_path.split(":")[0] == "registry":
        return dataclasses.replace(new, path=ckpt_path or None)
    if ckpt_path == "hpc":  # as Lightning resolves it (the largest N), then checked below like any other file
        numbered = {path.stem.removeprefix("hpc_ckpt_"): path for path in Path(root).glob("hpc_ckpt_*.ckpt")}
        found = {int(number): path for number, path in numbered.items() if number.isdigit()}
        if not found:
            raise CheckpointError(f"--ckpt_path hpc: no hpc_ckpt_N.ckpt in {Path(root).absolute()} (the "
                                  f"default_root_dir, where SLURM requeues save them); give a .ckpt file instead")
        ckpt_path = str(found[max(found)].absolute())
    searched = [Path(f) for f in folders]
    if not folders and experiment is not None:
        searched = [run.folder / "checkpoints" for run in runs.runs_of(experiment)]
    if ckpt_path == "best":
        files = sorted(str(p) for f in searched for p in f.glob("*.ckpt") if not p.name.startswith("last"))
        examples = f"; found: {', '.join(files[:3])}" if files else ""
        raise CheckpointError(
            f"--ckpt_path best means the best checkpoint of this process's own fit, which a new run does not have "
            f"yet; give the file instead (--ckpt_path FILE){examples}")
    if ckpt_path != "last":
        if not Path(ckpt_path).is_file():
            raise CheckpointError(f"checkpoint not found: {ckpt_path}; give an existing .ckpt file, or "
                                  f"--ckpt_path last")
        return dataclasses.replace(new, path=ckpt_path, why=f"new, trained on from {ckpt_path}")
    if folders or experiment is None:
        return _last_in(folders, restarts, attempt, root)
    attempt_note = f" (torchrun attempt {attempt} of {restarts + 1})" if restarts > 0 else ""
    return _last_run(experiment, run_name, legacy, restarts > 0 or runs.restarted_job(environ) is not None,
                     runs.job_keys(environ), runs.restarted_job(environ), root, attempt_note)


def _newest_valid_in(folders: Sequence[Path]) -> Tuple[Optional[Path], Tuple[str, ...]]:
    """The newest valid last checkpoint of ``folders``, else their newest valid checkpoint of any name; a warning
    line per damaged file skipped. None valid: 66, naming them."""
    last_files = {path for folder in folders for path in Path(folder).glob("last*.ckpt")}  # Lightning's last ones
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
    return chosen, lines


def _last_in(folders: Sequence, restarts: int, attempt: int, root: Optional[str]) -> Resume:
    """``last`` in checkpoint folders a config named by hand (shared by every run that names them)."""
    where = ", ".join(str(f) for f in folders) or "the checkpoint folder"
    if not any(any(Path(folder).glob("last*.ckpt")) for folder in folders):
        if restarts > 0:
            return Resume(None, lines=(f"--ckpt_path last: no last checkpoint in {where} yet: starting a new run "
                                       f"(torchrun attempt {attempt} of {restarts + 1})",))
        raise CheckpointError(
            f"--ckpt_path last: no last checkpoint (last*.ckpt) in {where}, so there is nothing to resume (Lightning "
            f"would only warn and start from scratch); drop --ckpt_path to start a new run, or give a .ckpt file")
    chosen, lines = _newest_valid_in(folders)
    return Resume(str(chosen), why="resumed", lines=lines)


def _last_run(experiment: Path, run_name: Optional[str], legacy: Optional[Path], restartable: bool,
              jobs: Sequence[str], restarted: Optional[str], root: Optional[str], attempt: str = "") -> Resume:
    """Which run ``last`` resumes: the one ``--run_name`` names; else this job's own (a SLURM requeue, a torchrun
    restart: never another job's); else the experiment's newest; else a checkpoint from before runs had folders of
    their own. Where a restart finds nothing saved yet, a new run (one line); anywhere else nothing is 66."""
    found = runs.runs_of(experiment)
    if run_name is not None:
        run = runs.Run(experiment / run_name)
        if run.checkpoints("*.ckpt"):
            return _resume(run, "the run --run_name names")
        if restartable:
            return Resume(None, run_name, True, "the run --run_name names, nothing saved yet: started again",
                          lines=(f"--ckpt_path last: run {run.folder} has no checkpoint yet: starting it again",))
        if holder := run.holder():
            raise ConfigError(f"--run_name {run_name}: run {run.folder} is running now ({holder}); give another "
                              f"--run_name, or resume it once it has ended")
        names = ", ".join(r.name for r in found) or "none"
        raise CheckpointError(f"--ckpt_path last --run_name {run_name}: {run.folder} holds no checkpoint (runs of "
                              f"this experiment: {names}); check the name, or drop --ckpt_path to start it new")
    mine = [run for run in found if run.jobs() & set(jobs)]
    if mine:
        run = max(mine, key=runs.Run.newest_ns)
        job = ", ".join(sorted(run.jobs() & set(jobs)))
        if run.newest_ns():
            return _resume(run, f"the run of this {job}")
        return Resume(None, run.name, True, f"the run of this {job}, nothing saved yet: started again",
                      lines=(f"--ckpt_path last: the run of this {job}, {run.folder}, has no checkpoint yet: "
                             f"starting it again",))
    if restarted is not None:
        return Resume(None, lines=(f"--ckpt_path last: no run of this {restarted} in {experiment} (its first start "
                                   f"saved nothing): starting a new run",))
    saved = [run for run in found if run.newest_ns()]
    if saved:
        resumed = _resume(max(saved, key=runs.Run.newest_ns), f"the newest of {len(saved)} run(s) of this "
                                                               f"experiment with a checkpoint")
        return dataclasses.replace(resumed, newest=True)
    if legacy is not None and any(legacy.glob("last*.ckpt")):
        chosen, lines = _newest_valid_in([legacy])
        return Resume(str(chosen), None, False, f"new, trained on from {chosen}", lines + (
            f"--ckpt_path last resumes {chosen}, written before each run had a folder of its own; this run's files go "
            f"to a run folder in {experiment}, and the old folder is left as it is",), newest=True)
    if restartable:
        return Resume(None, lines=(f"--ckpt_path last: no run of {experiment} has a checkpoint yet: starting a new "
                                   f"run{attempt}",))
    runs.refuse_running(experiment)  # a running run saves its first checkpoint soon: which one is meant is unclear
    others = sorted(str(run.folder) for experiment_dir in Path(root or ".").absolute().glob("*")
                    if experiment_dir != experiment.absolute() for run in runs.runs_of(experiment_dir)
                    if run.newest_ns())
    elsewhere = (f"; runs of other experiments have one ({', '.join(others[:3])}): the experiment's folder is named "
                 f"by its network, strategy, batch and optimizer, so resume one with the flags it ran with"
                 if others else "")
    raise CheckpointError(
        f"--ckpt_path last: no run in {experiment} has a last checkpoint (last*.ckpt), so there is nothing to resume "
        f"(Lightning would only warn and start from scratch); drop --ckpt_path to start a new run, or give a .ckpt "
        f"file{elsewhere}")


def _resume(run: runs.Run, why: str) -> Resume:
    chosen, lines = _newest_valid_in([run.folder / "checkpoints"])
    return Resume(str(chosen), run.name, True, why, lines)


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


# ------------------------------------------------------------------ for one trainer


def prepare(trainer: Trainer, subcommand: str, resumed: Resume) -> None:
    """Before launch: rank 0 prints the resolution's lines; a finished fit raises NothingToTrain; Lightning's restore
    is handed the checkpoint the CLI read (unless the strategy reads the file itself: fsdp), so it is read once."""
    if trainer.is_global_zero:
        for line in resumed.lines:
            print(f"train.py: {line}", file=sys.stderr, flush=True)
    checkpoint, io = resumed.checkpoint, trainer.strategy.checkpoint_io
    if checkpoint and subcommand == "fit" and (done := finished_training(checkpoint, trainer.max_epochs,
                                                                         trainer.max_steps)):
        raise NothingToTrain(f"{resumed.path} {done}; nothing to train (raise --epochs to train on)")
    if checkpoint is not None and isinstance(io, checkpoint_io.VerifiedCheckpointIO) and \
            type(trainer.strategy).load_checkpoint is Strategy.load_checkpoint:
        io.hand_over(resumed.path, checkpoint)
