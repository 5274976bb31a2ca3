"""Train a Fashion-MNIST classifier, data-parallel, with LightningCLI.

    python train.py                                   # configs/default.yaml, CPU or one GPU
    python train.py --strategy ddp --devices 4        # 4 GPUs over NCCL (gloo with --accelerator cpu)
    python train.py --config configs/recipes/sgd_momentum.yaml --epochs 5
    python train.py test --ckpt_path runs/fashion_mnist/checkpoints/last.ckpt

No subcommand means ``fit``; after fit the best checkpoint is tested unless
``--test_after_fit false``. Shorthand flags are listed under ``--help``
(cli/shorthand.py). A user's mistake ends with one line on stderr and a
non-zero exit code (cli/errors.py), not a traceback.
"""

import os
import signal
import subprocess
import sys
import time
import warnings
from argparse import RawDescriptionHelpFormatter
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from callbacks import StopAtTarget
from callbacks.divergence import TrainingDiverged
from callbacks.job_faults import JobFaults, describe_fault
from callbacks.preemption import SIGNALS, Preempted, Preemption, install_handlers
from callbacks.rng_state import RngState
from callbacks.tensorboard_run import TensorBoardRun, start_run
from callbacks.tensorboard_run import continue_run as continue_tensorboard_run
from checkpointing import CheckpointCorruptError, CheckpointWriteError, VerifiedCheckpointIO, newest_valid, verify
from cli.checks import check_at_least_one, check_config_file, check_devices, check_writable, config_files
from cli.errors import CheckpointNotFoundError, ConfigError, ExitCode, OutputNotWritableError, one_line
from cli.shorthand import SUBCOMMANDS, ShorthandError, expand_args, shorthand_help
from datamodules import CorruptDataError, DataNotFoundError, FashionMNISTDataModule
from lightning_modules import FashionMNISTClassifier
from strategies import LAYERWISE_OPTIMIZERS, is_fsdp, register_strategies
from strategies import torchrun
from strategies.lifetime import LAUNCHER_PID_ENV, die_with_parent, mark_launcher, set_collective_timeout
from strategies.dp import require_cuda_for_dp

# Deprecations inside Lightning 2.6 itself (its calls into torch 2.14), not actionable by our users.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
warnings.filterwarnings("ignore", message=r".*torch.distributed.nn.functional.all_gather is deprecated.*")

# Values of --ckpt_path that Lightning resolves itself rather than reading as a file name.
CHECKPOINT_KEYWORDS = ("last", "best", "hpc", "registry")
# The user's mistakes that are not about flags or values (those exit with ExitCode.USAGE).
EXIT_CODES = {
    DataNotFoundError: ExitCode.DATA,
    CorruptDataError: ExitCode.DATA,
    CheckpointNotFoundError: ExitCode.CHECKPOINT,
    CheckpointCorruptError: ExitCode.CHECKPOINT,
    OutputNotWritableError: ExitCode.CANT_CREATE,
    CheckpointWriteError: ExitCode.CANT_CREATE,
}
USER_ERRORS = (ShorthandError, ArgumentError, ConfigError, *EXIT_CODES)
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "default.yaml"


class FashionMNISTCLI(LightningCLI):
    """LightningCLI with our defaults file, one-line errors and a test run after fit."""

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        kwargs.setdefault("exit_on_error", False)  # main() turns parse errors into one line
        kwargs.setdefault("epilog", shorthand_help())
        kwargs.setdefault("formatter_class", RawDescriptionHelpFormatter)
        return super().init_parser(**kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="fit only: evaluate the best checkpoint on the test split when training ends",
        )
        # Its own section (--stop_at_target.target_accuracy, shorthand --target_accuracy), not an entry of
        # trainer.callbacks: a list entry has no key a flag could name. LightningCLI appends it to the callbacks.
        parser.add_lightning_class_args(StopAtTarget, "stop_at_target")

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        # LightningCLI warns when both sys.argv and args are set; main() always passes the rewritten argv.
        self.config = parser.parse_args(args)
        # LightningCLI reads the hyperparameters of --ckpt_path FILE right after this: a damaged file ends the run
        # here with exit 66 and one line (torch.load would raise an UnpicklingError about weights_only, or load it).
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and "://" not in ckpt_path and Path(ckpt_path).is_file():
            verify(ckpt_path)
            self._explicit_checkpoint = Path(ckpt_path)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        max_epochs = config.trainer.max_epochs
        if max_epochs is not None and (max_epochs == 0 or max_epochs < -1):
            raise ConfigError(f"trainer.max_epochs (--epochs) must be >= 1, or -1 for no limit; got {max_epochs}")
        self._check_strategy(config)
        self._check_devices(config.trainer)
        check_at_least_one("trainer.accumulate_grad_batches", config.trainer.accumulate_grad_batches)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and ckpt_path.split(":")[0] not in CHECKPOINT_KEYWORDS and not Path(ckpt_path).is_file():
            raise CheckpointNotFoundError(
                f"checkpoint not found: {ckpt_path}; give an existing .ckpt file, or --ckpt_path last"
            )

    @staticmethod
    def _resolved_accelerator(trainer) -> Optional[str]:
        """``cpu``, ``cuda``, ``mps``... as Lightning will choose it; None for an Accelerator object from a config."""
        if not isinstance(trainer.accelerator, str):
            return None
        accelerator = trainer.accelerator.lower()
        cuda = torch.cuda.is_available()
        if accelerator == "auto":
            mps = getattr(torch.backends, "mps", None)
            return "cuda" if cuda else "mps" if mps is not None and mps.is_available() else "cpu"
        return "cuda" if accelerator == "gpu" and cuda else accelerator

    @classmethod
    def _check_devices(cls, trainer) -> None:
        """More CPU processes than cores, or more GPUs than visible: refused before anything starts (cli/checks.py)."""
        accelerator = cls._resolved_accelerator(trainer)
        if str(trainer.strategy).lower() == "dp":
            return  # dp has its own check (_check_strategy)
        if accelerator in ("cpu", "cuda"):
            cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
            check_devices(trainer.devices, accelerator, os.cpu_count(), cuda_devices)

    @classmethod
    def _check_strategy(cls, config) -> None:
        """dp needs GPUs; ``--strategy fsdp`` on CPU runs our gloo FSDP (Lightning refuses CPU), without layer-wise optimizers."""
        trainer = config.trainer
        if str(trainer.strategy).lower() == "dp":
            try:
                require_cuda_for_dp()
            except MisconfigurationException as error:
                raise ConfigError(one_line(error)) from error
        if trainer.strategy == "fsdp" and cls._resolved_accelerator(trainer) == "cpu":
            trainer.strategy = "fsdp_cpu"
        optimizer = config.model.optimizer
        if is_fsdp(trainer.strategy) and optimizer in LAYERWISE_OPTIMIZERS:
            raise ConfigError(
                f"--optimizer {optimizer} computes per-layer norms, but fsdp gives each rank only a slice of a layer; "
                f"use --strategy ddp with {optimizer}, or sgd/adamw with fsdp"
            )

    def instantiate_classes(self) -> None:
        """A value that parses but cannot run (``--strategy foo``) is the user's mistake: say so in one line."""
        try:
            super().instantiate_classes()
        except (MisconfigurationException, ValueError, TypeError, ImportError) as error:
            # ImportError: e.g. --accelerator tpu without torch_xla installed.
            raise ConfigError(one_line(error)) from error
        # Always on, whatever the config: atomic checksummed saves, verified loads (a CheckpointIO given as a
        # plugin is kept), a verified last.ckpt on SIGTERM / SIGUSR1 / Ctrl-C, the RNG state in checkpoints, and
        # no collective save on exception when a rank is lost or stuck.
        strategy = self.trainer.strategy
        if type(strategy.checkpoint_io) is TorchCheckpointIO:
            strategy.checkpoint_io = VerifiedCheckpointIO()
        self.trainer.callbacks.append(Preemption())
        self.trainer.callbacks.append(RngState())  # exact resume: dropout draws continue where they stopped
        self.trainer.callbacks.append(TensorBoardRun())  # a resume logs into the checkpoint's run folder
        # A lost or stuck rank, a stalled data worker: exit 75. First: its on_exception must run before the checkpoint
        # callbacks' (Lightning put those last when it built the trainer).
        self.trainer.callbacks.insert(0, JobFaults())

    def _check_before_launch(self) -> None:
        """Check the output folders and ``--ckpt_path``, and find (or download) and check the data, in the
        launching process before any worker process exists.

        A missing or damaged file then ends the run with one line here, instead of one rank failing
        inside ``fit`` (or mid-epoch) while the others wait for it. Only what would be each node's local
        rank 0 does it, as Lightning's own ``prepare_data`` would.
        """
        self._check_outputs_writable()
        warning = torchrun.shared_store_warning() if self.subcommand == "fit" else None
        if warning and self.trainer.is_global_zero:
            print(f"train.py: warning: {warning}", file=sys.stderr, flush=True)
        self._continued_run = False
        self._check_checkpoint_keyword()
        explicit = getattr(self, "_explicit_checkpoint", None)
        if explicit is not None:
            self._resume_from(explicit)
        if self.subcommand == "fit" and not self._continued_run:
            start_run(self.trainer)  # a new TensorBoard run folder (callbacks/tensorboard_run.py)
        if self.datamodule is not None and self.trainer.local_rank == 0:
            self.datamodule.prepare_data()

    def _check_outputs_writable(self) -> None:
        """The log folder (and for fit the checkpoint folders) can be created and written; nothing is created here."""
        folders = [("trainer.logger.init_args.save_dir", getattr(logger, "save_dir", None))
                   for logger in self.trainer.loggers]
        if self.subcommand == "fit":
            folders += [("ModelCheckpoint dirpath (trainer.callbacks)", getattr(callback, "dirpath", None))
                        for callback in self.trainer.checkpoint_callbacks]
        check_writable(folders)

    def _check_checkpoint_keyword(self) -> None:
        """``--ckpt_path last`` with no last checkpoint, or ``best`` in a new process: say so instead of Lightning's
        warning-and-train-from-scratch (last) or traceback (best)."""
        ckpt_path = self.config[self.subcommand].get("ckpt_path")
        checkpoints = [cb for cb in self.trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
        folders = sorted({str(cb.dirpath) for cb in checkpoints if cb.dirpath})
        where = ", ".join(folders) or "the checkpoint folder"
        if ckpt_path == "last":
            if not all(hasattr(cb, "_find_last_checkpoints") for cb in checkpoints):
                return  # a Lightning without it: leave "last" to Lightning
            found = set()
            for callback in checkpoints:
                found |= callback._find_last_checkpoints(self.trainer)  # the files Lightning itself will consider
            found |= {cb.ckpt_path for cb in self.trainer.callbacks
                      if isinstance(cb, OnExceptionCheckpoint) and os.path.isfile(cb.ckpt_path)}
            if not found and torchrun.max_restarts() > 0:
                # torchrun --max-restarts re-runs this very command after a failure, so the same --ckpt_path last
                # must also start the first attempt (and one that failed before any checkpoint was saved).
                self.config_init[self.subcommand]["ckpt_path"] = None
                if self.trainer.is_global_zero:
                    print(f"train.py: --ckpt_path last: no last checkpoint in {where} yet: starting a new run "
                          f"(torchrun attempt {torchrun.attempt()} of {torchrun.max_restarts() + 1})",
                          file=sys.stderr, flush=True)
                return
            if not found:
                raise CheckpointNotFoundError(
                    f"--ckpt_path last: no last checkpoint (last*.ckpt) in {where}, so there is nothing to resume "
                    f"(Lightning would only warn and start from scratch); drop --ckpt_path to start a new run, "
                    f"or give a .ckpt file"
                )
            self._resume_from(self._newest_valid_checkpoint(found, folders), continue_run=True)
        elif ckpt_path == "best":
            files = sorted(str(p) for folder in folders for p in Path(folder).glob("*.ckpt")
                           if not p.name.startswith("last"))
            examples = f"; found: {', '.join(files[:3])}" if files else ""
            raise CheckpointNotFoundError(
                f"--ckpt_path best means the best checkpoint of this process's own fit, which a new run does not "
                f"have yet; give the file instead (--ckpt_path FILE){examples}"
            )

    def _newest_valid_checkpoint(self, last_files, folders) -> Path:
        """The newest ``last*.ckpt`` that verifies; if none does, the newest valid checkpoint of any name in the
        checkpoint folders, with one warning line per damaged file skipped (exit 66 when none is valid)."""
        chosen, rejected = newest_valid(last_files)
        if chosen is None:
            others = {p for folder in folders for p in Path(folder).glob("*.ckpt")} - {Path(p) for p in last_files}
            chosen, more = newest_valid(others)
            rejected += more
        if chosen is None:
            raise CheckpointCorruptError(", ".join(e.path for e in rejected),
                                         "--ckpt_path last found no valid checkpoint: "
                                         + "; ".join(e.reason for e in rejected))
        if rejected and self.trainer.is_global_zero:
            for error in rejected:
                print(f"train.py: warning: {one_line(error)}; skipped", file=sys.stderr, flush=True)
            print(f"train.py: warning: --ckpt_path last resumes from {chosen}, the newest valid checkpoint",
                  file=sys.stderr, flush=True)
        return chosen

    def _resume_from(self, path: Path, continue_run: bool = False) -> None:
        """Resume from ``path`` (a verified file); in fit, stop here with exit 0 when it already finished training.

        ``continue_run`` (``--ckpt_path last``): TensorBoard logs into the checkpoint's own run folder from the
        checkpoint's step on, hiding what was logged after it (callbacks/tensorboard_run.py).
        """
        self.config_init[self.subcommand]["ckpt_path"] = str(path)
        if self.subcommand == "fit":
            checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
            done = finished_training(checkpoint, self.trainer.max_epochs, self.trainer.max_steps)
            if done:
                raise NothingToTrain(f"{path} {done}; nothing to train (raise --epochs to train on)")
            if continue_run:
                self._continued_run = continue_tensorboard_run(self.trainer, checkpoint) is not None

    before_fit = before_validate = before_test = before_predict = _check_before_launch

    def after_fit(self) -> None:
        if self.trainer.interrupted or not self.config.fit.test_after_fit:
            return
        checkpoint = self.trainer.checkpoint_callback
        best = checkpoint.best_model_path if checkpoint is not None else ""
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)


class NothingToTrain(Exception):
    """``fit`` from a checkpoint that already reached max_epochs / max_steps (a requeued job that had finished)."""


def finished_training(checkpoint: dict, max_epochs: Optional[int], max_steps: int) -> Optional[str]:
    """Why ``checkpoint`` (as loaded) has nothing left to train under these limits, or None."""
    loops = checkpoint.get("loops") or {}
    epochs = (loops.get("fit_loop", {}).get("epoch_progress", {}).get("current", {}).get("processed"))
    steps = checkpoint.get("global_step", 0)
    if max_steps is not None and max_steps > 0 and steps >= max_steps:
        return f"has finished training: {steps} optimizer steps trained, --trainer.max_steps {max_steps}"
    if max_epochs is not None and max_epochs > 0 and epochs is not None and epochs >= max_epochs:
        return f"has finished training: {epochs} epoch(s) trained, --epochs {max_epochs}"
    return None


def build_cli(args: Sequence[str]) -> FashionMNISTCLI:
    """Parse already-expanded ``args`` (subcommand first), build the objects and run the subcommand."""
    defaults = [str(DEFAULT_CONFIG)] if DEFAULT_CONFIG.is_file() else []
    register_strategies()  # dp and fsdp_cpu, before the parser validates --trainer.strategy
    try:
        set_collective_timeout()  # $FASHION_MNIST_COLLECTIVE_TIMEOUT, default 300 s, for every ddp/fsdp name
    except ValueError as error:
        raise ConfigError(str(error)) from error
    return FashionMNISTCLI(
        FashionMNISTClassifier,
        FashionMNISTDataModule,
        args=list(args),
        parser_kwargs={name: {"default_config_files": defaults} for name in SUBCOMMANDS},
        save_config_kwargs={"overwrite": True},
    )


def main(args: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python train.py`` and ``fashion-mnist-train``; returns the process exit code."""
    argv: List[str] = list(sys.argv[1:] if args is None else args)
    die_with_parent()  # a rank started by a launcher dies with it (Linux)
    launcher_pid = os.environ.get(LAUNCHER_PID_ENV)
    mark_launcher()  # the ranks Lightning's launcher starts from here check that this process still runs
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    install_handlers()  # SIGTERM / SIGUSR1 / Ctrl-C: stop every rank at the next step, with last.ckpt
    try:
        return _run(argv)
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
        if launcher_pid is None:  # main() called in-process: leave the caller's environment as it was
            os.environ.pop(LAUNCHER_PID_ENV, None)
        else:
            os.environ[LAUNCHER_PID_ENV] = launcher_pid


def _run(argv: List[str]) -> int:
    cli = None
    try:
        expanded = expand_args(argv)
        for name in config_files(expanded):
            check_config_file(name)
        cli = build_cli(expanded)
    except NothingToTrain as done:
        print(f"train.py: {done}", flush=True)
        return ExitCode.OK
    except Preempted as stop:
        if stop.rank == 0:
            print(f"train.py: {one_line(stop)}", file=sys.stderr, flush=True)
        _wait_for(stop.children)
        return stop.exit_code
    except KeyboardInterrupt:
        print("train.py: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        return ExitCode.INTERRUPTED
    except USER_ERRORS as error:
        code = EXIT_CODES.get(type(error), ExitCode.USAGE)
        hint = " (see python train.py --help)" if code == ExitCode.USAGE else ""
        print(f"train.py: error: {one_line(error)}{hint}", file=sys.stderr)
        return code
    except TrainingDiverged as error:
        # Raised on every rank at the same step (callbacks/divergence.py): one line, from rank 0 only.
        if error.rank == 0:
            print(f"train.py: error: {one_line(error)}", file=sys.stderr, flush=True)
        _wait_for(error.children)
        return ExitCode.DIVERGED
    except RuntimeError as error:
        # A rank lost or stuck, a peer that never joined, a busy MASTER_PORT, a stalled data worker: every rank that
        # sees it says so in one line (callbacks/job_faults.py). Anything else keeps its traceback.
        line = describe_fault(error, rank_zero_only.rank)
        if line is None:
            raise
        print(f"train.py: error: {line}", file=sys.stderr, flush=True)
        _wait_for(getattr(error, "children", []), timeout_s=2.0)  # lost or stuck: give them a moment, then end them
        return ExitCode.TEMPFAIL
    launcher = getattr(getattr(cli, "trainer", None), "strategy", None)
    _wait_for(list(getattr(getattr(launcher, "launcher", None), "procs", None) or []))  # ranks die with this one
    return ExitCode.OK


def _wait_for(children, timeout_s: float = 30.0) -> None:
    """Rank processes this process launched, stopping at the same step: wait for them; kill what is left after
    ``timeout_s`` (SIGKILL: a rank stuck in a collective ignores SIGTERM)."""
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    sys.exit(main())
