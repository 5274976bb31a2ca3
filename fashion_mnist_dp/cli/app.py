"""train.py's LightningCLI (wiring only: docs/architecture.md) and ``main``: every error one line and an exit code."""

import dataclasses
import sys
from argparse import RawDescriptionHelpFormatter
from pathlib import Path
from typing import Dict, List, NoReturn, Optional, Sequence

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from fashion_mnist_dp import runtime
from callbacks import Report, StopAtTarget
from callbacks.owner import find
from fashion_mnist_dp.cli import checkpoint_hparams, failures, outputs, run_folders, slurm, start_block
from fashion_mnist_dp.cli.checks import check_config, check_outputs, check_run_values
from fashion_mnist_dp.cli.shorthand import SUBCOMMANDS, expand_args, shorthand_help
from datamodules import FashionMNISTDataModule
from lightning_modules import FashionMNISTClassifier
from fashion_mnist_dp.runtime import checkpoint_io, compat, errors, lifetime, resume
from fashion_mnist_dp.strategies import register_strategies

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
DEFAULT_LR_FROM = f"{DEFAULT_CONFIG.parent.name}/{DEFAULT_CONFIG.name}"  # no flag, file or checkpoint gave the lr


# What the model takes from the data's settings (the batch it trains at), not from a checkpoint's.
LINKS = (("data.batch_size", "model.batch_size"), ("data.virtual_devices", "model.virtual_devices"))


class FashionMNISTCLI(compat.CheckpointHparamsOurs):
    """LightningCLI with our defaults, links, folders, ``--ckpt_path`` decided before anything is built, and a test."""

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        # Every parser, the subcommands' too: main() turns parse errors into one line; the shorthand table in --help.
        return super().init_parser(exit_on_error=False, epilog=shorthand_help(),
                                   formatter_class=RawDescriptionHelpFormatter, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        compat.batch_limits_count_first(parser)
        parser.add_argument("--test_after_fit", type=bool, default=True,
                            help="fit only: evaluate the best checkpoint on the test split when training ends")
        # Settings of callbacks in trainer.callbacks as top-level flags: the links set them on those that take them.
        parser.add_argument("--progress", type=Optional[bool], default=None,
                            help="a progress bar inside each epoch; default: when stdout is a terminal")
        parser.add_argument("--check_every_n_steps", type=int, default=runtime.DEFAULT_CHECK_EVERY_N_STEPS,
                            help="the ranks agree on stopping (signal, divergence) every N optimizer steps, and at "
                                 "every validation, epoch end and checkpoint: a signal stops the run within N steps")
        parser.add_argument("--collective_timeout", type=Optional[float], default=None,
                            help="seconds a rank waits in a collective or at the rendezvous before it stops (exit 75); "
                                 f"default: ${lifetime.TIMEOUT_ENV}, else {lifetime.DEFAULT_TIMEOUT_S:g}")
        parser.add_argument("--run_name", type=Optional[str], default=None,
                            help="the run's folder under its experiment's (default: when it started and its seed, "
                                 "20261201-233431-seed42); with --ckpt_path last: the run to resume")
        parser.add_argument("--breakdown", type=Optional[bool], default=None,
                            help="the per-rank step-time breakdown; default: on CPU ranks, off on GPUs until its "
                                 "sampled form is measured there (docs/benchmarks.md)")
        parser.add_argument("--peak_flops", type=Optional[float], default=None,
                            help="one device's peak FLOP/s for MFU; default: Lightning's table for the GPU and "
                                 "precision, on a CPU a matmul measured at start-up (docs/reporting.md)")
        parser.link_arguments("breakdown", "trainer.callbacks.init_args.breakdown")
        parser.link_arguments("peak_flops", "trainer.callbacks.init_args.peak_flops")
        parser.link_arguments("progress", "trainer.callbacks.init_args.show_progress")
        parser.link_arguments("check_every_n_steps", "trainer.callbacks.init_args.check_every_n_steps")
        # Its own section (--stop_at_target.*, shorthand --target_accuracy): LightningCLI appends it to the callbacks.
        parser.add_lightning_class_args(StopAtTarget, "stop_at_target")
        for source, target in LINKS:
            parser.link_arguments(source, target)

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse; decide the run's folders and ``--ckpt_path``; a resumed run's config again, in layers: defaults,
        the checkpoint's stored model settings (read and verified once, no code run), the user's files and flags."""
        self.config = parser.parse_args(args)  # args always given: main() rewrote the command line
        lr_from, notes = args.lr_origin, []  # args: shorthand.expand_args's
        subcommand = self.config["subcommand"]  # required: expand_args adds fit when none is given
        config = self.config[subcommand]
        # before any strategy is built: the registry's ddp and fsdp entries take it; a bad value: one line, exit 2
        timeout = lifetime.set_collective_timeout(lifetime.collective_timeout(seconds=config.get("collective_timeout")))
        check_run_values(config)  # before LightningCLI seeds: numpy's traceback for a seed out of range
        root = outputs.root_folder(config).absolute()  # its experiment's folder: --ckpt_path last chooses a run there
        resumed = self.resumed = resume.resolve(
            config.get("ckpt_path"), outputs.checkpoint_folders(config), lifetime.max_restarts(), lifetime.attempt(),
            str(root), root / outputs.experiment_name(config), outputs.given_run_name(config),
            root / outputs.legacy_experiment_name(config) / "checkpoints")
        if resumed.path and not checkpoint_io.is_remote(resumed.path) and Path(resumed.path).is_file():
            loaded = checkpoint_io.load(resumed.path)  # verified, no code runs; a bad file: exit 66
            self.resumed = dataclasses.replace(resumed, checkpoint=loaded)  # for prepare and Lightning's restore
            stored = checkpoint_hparams.stored_model(loaded, resumed.path)
            self.config = checkpoint_hparams.parse_over(parser, args, subcommand, stored, resumed.path)
            config = self.config[subcommand]
            notes = checkpoint_hparams.start_note(config.model, stored, resumed.path, {target for _, target in LINKS})
            if lr_from is None and "lr" in (stored.get("optimizer") or {}).get("init_args", {}):
                lr_from = f"the checkpoint {Path(resumed.path).name}"
        filled = outputs.fill_output_paths(config, self.resumed.run)
        self.start_lines = [f"  lr from         : {lr_from or DEFAULT_LR_FROM}", *notes]
        config.ckpt_path = self.resumed.path
        if config.data.worker_timeout is None:
            config.data.worker_timeout = timeout.total_seconds() / 2  # half: the stalled worker's rank reports first
            filled.append(("data", None, "worker_timeout"))
        if subcommand == "fit":  # before any logger is built: a continued run's TensorBoard folder from its step
            step = int((self.resumed.checkpoint or {}).get("global_step", 0))
            filled += outputs.tensorboard_runs(config, self.resumed.continued, step)
        self.save_config_kwargs["filled"] = filled

    def before_instantiate_classes(self) -> None:
        check_config(self.config[self.subcommand])

    def instantiate_classes(self) -> None:
        """A value that parses but cannot run (``--strategy foo``) or a constructor that raises: one line."""
        try:
            super().instantiate_classes()
            runtime.check_order(self.trainer.callbacks)  # here, in the launching process, before any rank starts
        except MisconfigurationException as error:  # our own checks' and Lightning's: they name the key
            raise errors.ConfigError(errors.one_line(error)) from error
        except Exception as error:  # a constructor the config names raised: one line naming it
            built = failures.failed_constructor(error, class_paths(self.config[self.subcommand]))
            if built is None and not isinstance(error, (ValueError, TypeError, ImportError)):
                raise
            key, path, raised = built or ("", "", error)
            line = f"{key} {path} cannot be built: {type(raised).__name__}: " if built else ""
            raise errors.ConfigError(line + errors.one_line(raised)) from error
        self.start_lines += [*start_block.unseen_settings(self.trainer), *start_block.safety_off(self.trainer)]

    def _before_launch(self) -> None:
        """In the launching process, before any rank exists: folders, rendezvous, checkpoint and data checked."""
        check_outputs(self.trainer, self.subcommand)
        environment = getattr(self.trainer.strategy, "cluster_environment", None)
        if environment is not None and self.trainer.world_size > 1:
            try:  # before any rendezvous: a name that does not resolve here made c10d retry it without end
                address, note = slurm.rendezvous_address(environment)
            except LookupError as error:
                raise errors.JobFault(str(error)) from error
            # gloo's interface before the process group, in every rank
            self.start_lines += [line for line in (note, slurm.gloo_interface(address)) if line]
        if self.subcommand == "fit" and self.trainer.is_global_zero and (warning := lifetime.shared_store_warning()):
            print(f"train.py: warning: {warning}", file=sys.stderr, flush=True)
        resume.prepare(self.trainer, self.subcommand, self.resumed)  # ckpt_path: resumed.path since parse_arguments
        checkpoint, self.resumed = self.resumed.checkpoint, dataclasses.replace(self.resumed, checkpoint=None)
        if self.datamodule.num_workers:  # the check's own workers too: one may be stuck in worker_init_fn
            lifetime.kill_data_workers_at_exit()
        self.datamodule.check_workers()  # every process, before any rendezvous
        if self.trainer.local_rank == 0:
            self.datamodule.prepare_data()
        if lifetime.probably_global_rank_zero():  # the others learn the folder from it (Lightning's log_dir)
            self.start_lines += run_folders.open_run(self.trainer, self.datamodule, self.config[self.subcommand],
                                                     self.subcommand, self.resumed, checkpoint)
            report = find(self.trainer.callbacks, Report)
            if report is not None:  # the Report prints the start block once training starts
                report.notes = self.start_lines
            elif self.subcommand == "fit":
                print("\n".join(["Run configuration", *self.start_lines]), file=sys.stderr, flush=True)
        elif self.trainer.strategy.root_device.type == "cuda":  # a rank a launcher started: its run's folder if known
            run_folders.flight_recorder_of_rank(self.config[self.subcommand], self.resumed)

    before_fit = before_validate = before_test = before_predict = _before_launch

    def after_fit(self) -> None:
        """The test after fit: the best checkpoint by val/acc; the last weights if validation used the test split."""
        if self.trainer.interrupted or not self.config.fit.test_after_fit:
            return
        # The first ModelCheckpoint (Lightning's checkpoint_callback may be another Checkpoint): the best by val/acc
        checkpoint = next((c for c in self.trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)), None)
        best = checkpoint.best_model_path if checkpoint is not None else ""
        if self.datamodule.validates_on_test_split:
            best = ""
            if self.trainer.is_global_zero:
                print("train.py: testing the last epoch's weights: validation used the test split, so the best "
                      "checkpoint by val/acc was chosen on these images (--data.val_size N holds out a validation "
                      "split)", flush=True)
        # The path, not "best": Lightning would warn that several ModelCheckpoints exist.
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)


class SaveConfigAsGiven(SaveConfigCallback):
    """config.yaml as the user gave it: derived folders stay null, so a rerun from it writes where it is told."""

    def __init__(self, parser, config, *args, filled=(), **kwargs) -> None:
        # Built after the last change to the config (LightningCLI.instantiate_trainer): the copy is what it saves.
        super().__init__(parser, outputs.as_given(config, filled), *args, **kwargs)


def class_paths(config) -> Dict[str, str]:
    """Every class the config names, by its key (``model.network``, ``trainer.callbacks.3``), and the Trainer."""
    found = {"trainer": f"{Trainer.__module__}.{Trainer.__qualname__}"}

    def walk(key: str, value) -> None:
        if isinstance(value, list):
            for index, item in enumerate(value):
                walk(f"{key}.{index}", item)
        elif hasattr(value, "items"):  # a Namespace: its items are its leaves, by dotted key
            for name, item in value.items():
                full = f"{key}.{name}" if key else name
                if full.endswith("class_path") and isinstance(item, str):
                    found[full.rpartition(".")[0]] = item
                else:
                    walk(full, item)

    walk("", config)
    return found


def _run(argv: List[str]) -> list:
    """Parse ``argv``, build the objects and run the subcommand; the processes it launched."""
    register_strategies()  # dp and FSDP2's fsdp, before the parser validates --trainer.strategy
    defaults = [str(DEFAULT_CONFIG)] if DEFAULT_CONFIG.is_file() else []
    cli = FashionMNISTCLI(FashionMNISTClassifier, FashionMNISTDataModule,
                          args=expand_args(argv),  # the command line and its --config files, read and checked once
                          parser_kwargs={name: {"default_config_files": defaults} for name in SUBCOMMANDS},
                          save_config_callback=SaveConfigAsGiven, save_config_kwargs={"overwrite": True})
    return compat.launched_children(cli.trainer)  # they end with this process: wait for them


def main(args: Optional[Sequence[str]] = None) -> int:
    """``python train.py`` and ``fashion-mnist-train``: the exit code (README's table)."""
    argv = list(sys.argv[1:] if args is None else args)
    with runtime.guarded_process() as handlers:
        return failures.reported(lambda: _run(argv), rank=lambda: rank_zero_only.rank,
                               failed_alone=runtime.end_peer_tasks, exiting=handlers.exiting)


def run() -> NoReturn:
    """``python train.py`` and ``fashion-mnist-train``: :func:`main`, and the process ends with its code."""
    runtime.exit_process(main())
