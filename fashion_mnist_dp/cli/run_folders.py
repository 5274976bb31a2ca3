"""Rank 0, before launch: the run's own folder made or taken (runtime/runs.py), the run's files pointed into it (its
logger, every checkpoint a config leaves without a folder), and the start block's lines about it: which run and why,
and what changed since the checkpoint when the world size did (docs/cli.md, "Where a run's files go")."""

import os
import warnings
from typing import List, Optional

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks.run_record import MetricsCSV
from datamodules.resumable import DataPositionWarning
from fashion_mnist_dp.cli.outputs import experiment_name, root_folder
from fashion_mnist_dp.runtime import hangs, runs
from fashion_mnist_dp.runtime.resume import Resume


def open_run(trainer: Trainer, datamodule, config, subcommand: str, resumed: Resume,
             checkpoint: Optional[dict]) -> List[str]:
    """Make or take the run's folder (one line, exit 2, when another run holds it) and point the run's files into it;
    the start block's lines."""
    seed = config.get("seed_everything")
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    experiment = root_folder(config) / experiment_name(config)
    start = {"jobs": list(runs.job_keys()), "subcommand": subcommand, "world_size": trainer.world_size,
             "resumed_from": resumed.path}
    folder = runs.claim(experiment, resumed.run, resumed.continued, resumed.newest, runs.new_name(seed, subcommand),
                        {"experiment": experiment.name, "seed": seed, "start": start})
    for logger in trainer.loggers:
        if isinstance(logger, MetricsCSV) and logger.run_name is None:
            logger.version = folder.name
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            callback.dirpath = os.path.realpath(folder / "checkpoints")  # as Lightning's own; the other ranks take
            # rank 0's in setup
    recorder = [hangs.flight_recorder(folder)] if trainer.strategy.root_device.type == "cuda" else []
    step = (checkpoint or {}).get("global_step")
    how = f"resumed at optimizer step {step}, {resumed.why}" if resumed.continued and step is not None else resumed.why
    seeded = f"; seed {seed}" if seed is not None else ""
    return [f"  run             : {folder} ({how}{seeded})", *world_changed(trainer, datamodule, checkpoint),
            *recorder]


def world_changed(trainer: Trainer, datamodule, checkpoint: Optional[dict]) -> List[str]:
    """The start block's line when the checkpoint was written by another number of processes or another batch: what
    the effective batch and the lr were, and where the data goes on (the data module's own warning then says it no
    more)."""
    position = ((checkpoint or {}).get(type(datamodule).__qualname__) or {}).get("train_position") or {}
    if not position or datamodule is None:
        return []
    virtual = int(getattr(datamodule, "virtual_devices", 1) or 1)  # the loader's figures count virtual devices
    per_process = datamodule.batch_size * int(getattr(trainer.strategy, "devices_per_process", 1)) * virtual
    old = (int(position["world_size"]), int(position["batch_size"]))
    if old == (trainer.world_size * virtual, per_process):
        return []
    warnings.filterwarnings("ignore", message="the checkpoint stopped after", category=DataPositionWarning)
    old_processes = old[0] // virtual
    old_lr = ((checkpoint.get("lr_schedulers") or [{}])[0].get("base_lrs") or [None])[0]
    lr = f" at lr {old_lr:g}" if isinstance(old_lr, float) else ""
    epochs_done = ((checkpoint.get("loops") or {}).get("fit_loop", {}).get("epoch_progress", {})
                   .get("current", {}).get("processed"))
    epoch, batches = int(position["epoch"]), int(position["batches"])
    goes_on = (f"epoch {epoch + 2} starts at its first batch" if epochs_done is not None and epochs_done > epoch
               else f"epoch {epoch + 1} goes on at batch {batches + 1} of the new order, so some of its images are "
                    f"trained twice or not at all")
    return [f"  resumed from    : {old_processes} process(es) of {old[1]} images a batch, effective "
            f"{old_processes * old[1] * trainer.accumulate_grad_batches}{lr} (now: as above); {goes_on}"]


def flight_recorder_of_rank(config, resumed: Resume) -> None:
    """A rank other than 0 sets NCCL's flight recorder before its process group as rank 0 does: into the run's folder
    where it knows it before launch, else the experiment's, named by the job (rank 0's launch gives its own ranks
    the run's folder through their environment)."""
    if "TORCH_FR_DUMP_TEMP_FILE" in os.environ:  # set by rank 0 for the ranks it launched, or by the user
        return
    experiment = root_folder(config) / experiment_name(config)
    job = "-".join(key.replace(" ", "-").lower() for key in runs.job_keys()) or "job"
    folder = experiment / resumed.run if resumed.run else experiment / f"nccl-trace-{job}"
    folder.mkdir(parents=True, exist_ok=True)
    hangs.flight_recorder(folder)
