"""Images/sec and cumulative training time per epoch over all ranks, validation excluded: all ranks' images over the
slowest rank's time (Lightning's ThroughputMonitor assumes every rank is as fast as rank 0); and where each rank's
step time goes (callbacks/step_time.py), in the same record and the same epoch-end gather. Inside an epoch, images/sec
per window of ``log_every_n_steps``, from rank 0's clock: a curve for the review page (callbacks/review_page.py); and
beside each, achieved FLOP/s and MFU (callbacks/flops.py). The clock and the arithmetic over the ranks:
callbacks/epoch_clock.py."""

from typing import List, Optional

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks import review_page, step_marks, step_time
from callbacks.owner import each
from callbacks.epoch_clock import EpochClock, EpochTiming, combine_ranks
from callbacks.flops import DeviceUse, peak_refusal
from callbacks.step_marks import CudaEvents, HostClock, StepTimer
from callbacks.run_record import EpochRecord


def format_epoch_line(record: EpochRecord, mfu: Optional[float] = None) -> str:
    """The DLI workshop's per-epoch line, so figures can be compared with the course's; ``n/a`` where the record has
    no value (no validation ran in that epoch); ``, MFU = 3.1 %`` at its end where the device's peak is known."""

    def num(value) -> str:
        return "n/a" if value is None else f"{float(value):.3f}"

    line = (f"Epoch {record.epoch}: Cumulative Time = {record.cumulative_s:.3f}, Images/sec = "
            f"{record.images_per_sec:.2f}, Val Loss = {num(record.val_loss)}, Val Acc = {num(record.val_acc)}")
    if mfu is not None:
        percent = 100 * mfu
        line += f", MFU = {percent:.{1 if percent >= 1 else 2}f} %"  # 31.4 %, 3.1 %, 0.31 %
    return line


def log_to_loggers(trainer: Trainer, metrics: dict, step: Optional[int] = None) -> None:
    """Already-gathered global values straight to the loggers, rank 0 only (``self.log`` would reduce them again), at
    ``step`` or the step just taken, beside ``val/*``: below the step a resume purges from (runtime/resume.py)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=max(trainer.global_step - 1 if step is None else step, 0))


def gather_rows(trainer: Trainer, values: List[float]) -> List[List[float]]:
    """Every rank's ``values`` (the same length on each), one row per rank: one collective, one host read."""
    local = torch.tensor(values, dtype=torch.float64, device=trainer.strategy.root_device)
    return trainer.strategy.all_gather(local).reshape(-1, len(values)).tolist()


class ThroughputReport(Callback):
    """Prints the workshop's epoch line on rank 0 and logs ``throughput/*`` and ``time/*`` (README, "What a run
    reports"); ``time/first_step_s`` carries compilation and warm-up, and is printed with ``--model.compile true``."""

    def __init__(self, breakdown: Optional[bool] = None, check_every_n_steps: int = 50,
                 gpu_sample_every: int = 20, peak_flops: Optional[float] = None) -> None:
        """``breakdown``: the per-rank step-time breakdown, per epoch and per window of ``check_every_n_steps``
        optimizer steps, the ranks' decision points (linked from ``--check_every_n_steps``). None: on CPU ranks, where
        it costs nothing measurable, off on CUDA ranks until its sampled form is measured there (docs/benchmarks.md);
        True: on both. ``gpu_sample_every``: on CUDA ranks one batch in this many is timed (CUDA events, reused) and
        the parts are scaled to all of them; the line and ``time/sampled_every`` say so. CPU ranks time every batch.
        ``peak_flops``: one device's peak FLOP/s for MFU (linked from ``--peak_flops``); None: Lightning's table for
        the GPU and precision, or a matmul measured at start-up on a CPU (callbacks/flops.py)."""
        if gpu_sample_every < 1:
            raise MisconfigurationException(f"gpu_sample_every must be >= 1, got {gpu_sample_every}")
        self.peak_flops, self.device_use = peak_flops, DeviceUse()  # counted at setup, on rank 0
        self.breakdown, self.gpu_sample_every, self.every = breakdown, gpu_sample_every, check_every_n_steps
        self.timer: Optional[StepTimer] = None  # set at setup when the breakdown runs
        self.comm_timed = ""  # which collectives the breakdown times (registered at train start)
        self.clock = EpochClock()
        self.cumulative_s = 0.0
        self.first_step_s: Optional[float] = None
        self._validated, self._val_images = False, 0  # since the epoch's line; this rank's, in the last validation
        # optimizer steps of this fit; a window ends where Lightning writes its logs (-1: not on this rank, no logger)
        self._steps, self._window_every, self._window_end = 0, 0, -1
        self._windows = Throughput(window_size=2)  # rank 0's rate over the last window, × the world size
        self._before = (0.0, 0)  # this rank's training seconds and images in this fit's epochs before this one

    @staticmethod
    def _sync(trainer: Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def breakdown_on(self, device: str) -> bool:
        """Whether the breakdown runs on ranks of this device type (``cpu``, ``cuda``)."""
        return device in ("cpu", "cuda") and (self.breakdown if self.breakdown is not None else device == "cpu")

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        device, net = trainer.strategy.root_device.type, getattr(pl_module, "net", None)
        if peak_refusal(self.peak_flops):  # here, not in __init__: jsonargparse builds the callbacks while it parses
            raise MisconfigurationException(peak_refusal(self.peak_flops))
        if stage == "fit" and isinstance(net, torch.nn.Module) and trainer.is_global_zero:  # before the start block
            self.device_use = DeviceUse.measure(net, getattr(pl_module, "batch_size", 2) * getattr(
                pl_module, "virtual_devices", 1), trainer.strategy.root_device, trainer.precision, self.peak_flops)
        if stage == "fit" and self.breakdown_on(device):
            self.timer = StepTimer(HostClock()) if device == "cpu" else StepTimer(CudaEvents(), self.gpu_sample_every)

    def start_lines(self, trainer: Trainer) -> List[str]:
        """The start block's lines: the breakdown's, and the training FLOPs and the peak."""
        device = trainer.strategy.root_device.type
        timed = f"; {self.comm_timed}" if self.timer and self.comm_timed else ""
        return [f"  breakdown       : {'on' if self.breakdown_on(device) else 'off'} on {device} ranks{timed}",
                *self.device_use.lines]

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.timer is not None:
            self.comm_timed = step_marks.time_collectives(self.timer, trainer.strategy, pl_module)
        review_page.write_layout(trainer, self.timer is not None, self.device_use)
        every = trainer.log_every_n_steps if trainer.is_global_zero and trainer.loggers else 0
        self._steps, self._window_every, self._before = 0, every, (0.0, 0)
        self._window_end = every - trainer.global_step % every if every else -1  # a resumed run: Lightning's count
        self._windows = Throughput(world_size=trainer.world_size, window_size=2)
        self._windows.update(time=0.0, batches=0, samples=0)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._sync(trainer)
        self.clock.start_epoch()
        if self.timer is not None:
            self.timer.start_epoch()  # on CUDA: its first event, after the device is synchronised

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        self.clock.start_batch()
        if self.timer is not None:
            self.timer.batch_start(window=trainer.global_step // self.every)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss) -> None:
        if self.timer is not None:
            self.timer.before_backward()

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.timer is not None:
            self.timer.after_backward()

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        self._steps += 1
        if self.timer is not None:
            self.timer.before_optimizer()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.first_step_s is None:
            self._sync(trainer)
            self.first_step_s = self.clock.end_batch(len(batch[1]))
            log_to_loggers(trainer, {"time/first_step_s": self.first_step_s})
            if trainer.is_global_zero and getattr(pl_module, "compile_network", False):
                print(f"First training step: {self.first_step_s:.1f} s (includes torch.compile)", flush=True)
        else:
            self.clock.end_batch(len(batch[1]))
        if self.timer is not None:
            self.timer.batch_end()
        if self._steps == self._window_end:
            self._log_window(trainer)

    def _log_window(self, trainer: Trainer) -> None:
        """Lightning's Throughput over the training time since the last log step (validation and the time between
        epochs left out): rank 0's rate × the world size, no device read, no collective (docs/reporting.md)."""
        self._window_end += self._window_every
        seconds, images = self._before
        self._windows.update(time=seconds + self.clock.trained_s(), batches=self._steps,
                             samples=images + self.clock.timing.images)
        rates = self._windows.compute()
        mine = rates["device/samples_per_sec"]  # of this process's devices (dp: several)
        device = mine / getattr(trainer.strategy, "devices_per_process", 1)
        log_to_loggers(trainer, {"throughput/window/images_per_sec": rates.get("samples_per_sec", mine),
                                 "throughput/window/images_per_sec_per_device": device,
                                 **self.device_use.figures(device, "throughput/window/"),
                                 "epoch": trainer.current_epoch}, step=trainer.global_step - 1)

    # No stage check: the clock ignores a pause outside a training epoch (sanity check, the validate subcommand).
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._sync(trainer)
        self.clock.pause()
        self._val_images = 0

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._val_images += len(batch[1])  # every image once over the ranks (docs/architecture.md)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._sync(trainer)
        if trainer.state.fn == "fit" and not trainer.sanity_checking:  # val/acc's band at its step (review page)
            self._validated = True  # the images summed over the ranks: a collective at a decision point
            here = torch.tensor(float(self._val_images), device=pl_module.device)
            images = trainer.strategy.reduce(here, reduce_op="sum")
            log_to_loggers(trainer, review_page.accuracy_band(trainer.callback_metrics.get("val/acc"), int(images)))
        self.clock.resume()
        if self.timer is not None:
            self.timer.restart_data_time()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The epoch's record: logged (every logger, so ``metrics.csv`` holds it) and printed from the same values."""
        self._sync(trainer)
        mine = self.clock.end_epoch()
        self._before = (self._before[0] + mine.seconds, self._before[1] + mine.images)
        timer = self.timer
        parts = step_time.EpochParts(timer.take_epoch(), timer.marks, timer.sample_every,
                                     trainer.num_nodes == 1 and timer.clock.shared_by_ranks) if timer else None
        rows = gather_rows(trainer, [mine.images, mine.seconds, mine.data_wait_s, mine.compute_s,
                                     *(parts.row() if parts else [])])
        figures = combine_ranks([EpochTiming(int(r[0]), r[1], r[2], r[3]) for r in rows],
                                getattr(trainer.strategy, "devices_per_process", 1), self.cumulative_s)
        self.cumulative_s = figures["time/cumulative_s"]
        figures.update(self.device_use.figures(figures["throughput/images_per_sec_per_device"], "throughput/"))
        breakdown = None
        if parts is not None:
            breakdown, windows = parts.combine([row[4:] for row in rows], lambda values: gather_rows(trainer, values))
            for window, result in windows:  # each window's figures at its decision step
                log_to_loggers(trainer, step_time.part_columns("window", result),
                               step=min((window + 1) * self.every, trainer.global_step) - 1)
        validated, self._validated = self._validated, False  # a stop mid-epoch (max_steps) validates nothing
        logged = trainer.callback_metrics if validated else {}
        log_to_loggers(trainer, {**(step_time.metrics(breakdown) if breakdown is not None else {}),
                                 "epoch": trainer.current_epoch, **figures})
        line = format_epoch_line(EpochRecord(trainer.current_epoch + 1, self.cumulative_s,
                                             figures["throughput/images_per_sec"],
                                             logged.get("val/loss"), logged.get("val/acc")),
                                 figures.get("throughput/mfu"))
        if trainer.is_global_zero:
            bar = trainer.progress_bar_callback
            for text in [line] + ([step_time.format_line(breakdown)] if breakdown is not None else []):
                if bar is not None and bar.is_enabled:
                    bar.print(text)  # through the bar, so it is not broken
                else:
                    print(text, flush=True)

    def state_dict(self) -> dict:
        return {"cumulative_s": self.cumulative_s}

    @staticmethod
    def of(trainer: Trainer, user: Callback) -> "ThroughputReport":
        """The run's ThroughputReport, for a callback (``user``) that reads ``cumulative_s`` at ``on_train_epoch_end``:
        listed first, so that it includes the epoch that just ended, the number its epoch line prints."""
        callbacks = list(each(trainer.callbacks))
        reports, name = [c for c in callbacks if isinstance(c, ThroughputReport)], type(user).__name__
        if not reports:
            raise MisconfigurationException(f"{name} needs callbacks.Report (its ThroughputReport) in "
                                            "trainer.callbacks (its training time)")
        if callbacks.index(reports[0]) > callbacks.index(user):
            raise MisconfigurationException(f"put callbacks.Report before {name} in trainer.callbacks")
        return reports[0]

    def load_state_dict(self, state_dict: dict) -> None:
        self.cumulative_s = state_dict.get("cumulative_s", 0.0)
