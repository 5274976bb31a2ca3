"""Throughput arithmetic under a fake clock: all ranks' images over training time only."""

import pytest

from callbacks.run_record import EpochRecord
from callbacks.epoch_clock import EpochClock, EpochTiming, combine_ranks
from callbacks.throughput import format_epoch_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_validation_time_is_excluded_and_data_wait_is_split_from_compute():
    fake = FakeClock()
    clock = EpochClock(fake)
    clock.start_epoch()
    for _ in range(3):
        fake.advance(0.5)  # waiting for the batch
        clock.start_batch()
        fake.advance(2.0)  # forward/backward/step
        clock.end_batch(images=128)
    clock.pause()
    fake.advance(30.0)  # validation
    clock.resume()
    fake.advance(0.25)  # epoch-end work after validation counts as training time
    timing = clock.end_epoch()
    assert timing.images == 384
    assert timing.seconds == pytest.approx(3 * 2.5 + 0.25)
    assert timing.data_wait_s == pytest.approx(1.5)
    assert timing.compute_s == pytest.approx(6.0)


def test_epoch_ending_while_paused_stops_the_clock_at_the_pause():
    fake = FakeClock()
    clock = EpochClock(fake)
    clock.start_epoch()
    fake.advance(4.0)
    clock.pause()
    fake.advance(100.0)
    assert clock.end_epoch().seconds == pytest.approx(4.0)


def test_global_rate_is_all_images_over_the_slowest_rank_not_rank0_times_world():
    fast = EpochTiming(images=1000, seconds=1.0, data_wait_s=0.1, compute_s=0.9)
    slow = EpochTiming(images=1000, seconds=2.0, data_wait_s=0.5, compute_s=1.5)
    result = combine_ranks([fast, slow], cumulative_s=10.0)
    assert result["throughput/images_per_sec"] == pytest.approx(1000.0)  # 2000 images / 2 s; rank0 x 2 would say 2000
    assert result["throughput/images_per_sec_per_device"] == pytest.approx(500.0)
    assert result["time/epoch_s"] == pytest.approx(2.0)
    assert result["time/cumulative_s"] == pytest.approx(12.0)
    assert result["time/data_wait_s"] == pytest.approx(0.3)
    assert result["time/compute_s"] == pytest.approx(1.2)


def test_epoch_line_matches_the_workshop_format():
    line = format_epoch_line(EpochRecord(1, 32.6354, 1835.549, 0.27812, 0.90349))
    assert line == "Epoch 1: Cumulative Time = 32.635, Images/sec = 1835.55, Val Loss = 0.278, Val Acc = 0.903"
    assert format_epoch_line(EpochRecord(2, 1.0, 2.0, None, None)).endswith("Val Loss = n/a, Val Acc = n/a")


def test_the_epochs_training_time_so_far_ends_at_the_last_batch_and_leaves_validation_out():
    fake = FakeClock()
    clock = EpochClock(fake)
    clock.start_epoch()
    for batch in range(3):
        fake.advance(0.5)
        clock.start_batch()
        fake.advance(1.5)
        clock.end_batch(images=100)
        if batch == 0:
            clock.pause()
            fake.advance(30.0)  # validation: not training time
            clock.resume()
    fake.advance(7.0)  # after the last batch's end: not yet in a window
    assert clock.trained_s() == pytest.approx(6.0) and clock.timing.images == 300
    assert clock.end_epoch().seconds == pytest.approx(13.0)


@pytest.mark.parametrize("accumulate,every,steps", [(1, 3, [2, 5, 8, 11, 14]), (2, 2, [1, 3, 5, 7])])
def test_images_per_sec_is_logged_per_window_at_the_steps_lightning_writes_its_logs(
        fashion_root, tmp_path, accumulate, every, steps):
    """2 epochs of 8 batches: a window every ``every`` optimizer steps, logged once at each (also when gradients
    accumulate), where Lightning logs train/loss, across the epochs' end; the windows' figures, from rank 0's clock,
    tile the epochs' training time."""
    from callbacks import ThroughputReport
    from callbacks.run_record import MetricsCSV, read_rows
    from tests.unit.conftest import tiny_fit

    logger, batch = MetricsCSV(str(tmp_path), name="run", version=0), 32
    tiny_fit(fashion_root, tmp_path, [ThroughputReport()], logger=logger, limit_val_batches=0, max_epochs=2,
             log_every_n_steps=every, accumulate_grad_batches=accumulate, batch_size=batch)
    rows = read_rows(tmp_path / "run" / "version_0" / "metrics.csv")
    windows = [row for row in rows if row.get("throughput/window/images_per_sec")]
    assert [int(row["step"]) for row in windows] == steps
    assert [int(row["step"]) for row in rows if row.get("train/loss")] == steps
    assert all(row["throughput/window/images_per_sec_per_device"] == row["throughput/window/images_per_sec"]
               and row["epoch"] in ("0.0", "1.0") for row in windows)  # one device
    # Each window's seconds are its images over its rate. Back to back from the start, the windows hold all of the
    # first epoch (its tail after the last batch is in the next window) and end at a step of the second, so their
    # sum lies between the first epoch's time and both epochs', whatever the load: a rate off by 2x leaves that band.
    window_s = sum(every * accumulate * batch / float(row["throughput/window/images_per_sec"]) for row in windows)
    epoch_s = [float(row["time/epoch_s"]) for row in rows if row.get("time/epoch_s")]
    assert len(epoch_s) == 2 and epoch_s[0] < window_s <= (epoch_s[0] + epoch_s[1]) * (1 + 1e-9)


def test_a_window_is_rank_0s_images_times_the_world_size_over_its_training_time_across_an_epochs_end():
    """Rank 0 of 4, a log every 2 steps, batches of 100 images in 0.5 s of data wait and 1 s of step: the window at
    step 2 is 200 images in 3 s; the one at step 4 spans the epoch's end: 200 images in 3.5 s (the end of epoch 1
    after its last batch counts, the 10 s between the epochs do not)."""
    from types import SimpleNamespace

    import torch

    from callbacks import ThroughputReport

    fake, logged = FakeClock(), []
    report = ThroughputReport(breakdown=False)
    report.clock = EpochClock(fake)
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    strategy = SimpleNamespace(root_device=torch.device("cpu"), all_gather=lambda tensor: tensor, devices_per_process=1)
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger], log_every_n_steps=2, global_step=0, world_size=4,
                              current_epoch=0, strategy=strategy, num_nodes=1, callback_metrics={},
                              progress_bar_callback=None)
    batch = (None, list(range(100)))
    report.on_train_start(trainer, None)
    for epoch, batches in ((0, 3), (1, 1)):
        trainer.current_epoch = epoch
        report.on_train_epoch_start(trainer, None)
        for index in range(batches):
            fake.advance(0.5)
            report.on_train_batch_start(trainer, None, batch, index)
            fake.advance(1.0)
            report.on_before_optimizer_step(trainer, None, None)
            trainer.global_step += 1
            report.on_train_batch_end(trainer, None, None, batch, index)
        if epoch == 0:
            fake.advance(0.5)
            report.on_train_epoch_end(trainer, None)
            fake.advance(10.0)
    windows = [(step, metrics) for step, metrics in logged if "throughput/window/images_per_sec" in metrics]
    assert [step for step, _ in windows] == [1, 3]
    assert [metrics["throughput/window/images_per_sec"] for _, metrics in windows] == pytest.approx(
        [200 / 3.0 * 4, 200 / 3.5 * 4])
    assert [metrics["throughput/window/images_per_sec_per_device"] for _, metrics in windows] == pytest.approx(
        [200 / 3.0, 200 / 3.5])


def test_a_resumed_run_ends_its_windows_where_lightning_writes_and_its_first_at_the_resume():
    """Resumed at optimizer step 3 with a log every 2 steps: the windows end at steps 4 and 6 (logged at 3 and 5, as
    Lightning's train/loss), the first one over the 1 step trained since the resume."""
    from types import SimpleNamespace

    import torch

    from callbacks import ThroughputReport

    fake, logged = FakeClock(), []
    report = ThroughputReport(breakdown=False)
    report.clock = EpochClock(fake)
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    strategy = SimpleNamespace(root_device=torch.device("cpu"), devices_per_process=1)
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger], log_every_n_steps=2, global_step=3, world_size=1,
                              current_epoch=0, strategy=strategy)
    report.on_train_start(trainer, None)
    for index in range(3):  # no on_train_epoch_start: a mid-epoch resume starts at a batch
        fake.advance(1.0)
        report.on_train_batch_start(trainer, None, (None, [0] * 10), index)
        fake.advance(1.0)
        report.on_before_optimizer_step(trainer, None, None)
        trainer.global_step += 1
        report.on_train_batch_end(trainer, None, None, (None, [0] * 10), index)
    windows = [(step, metrics["throughput/window/images_per_sec"]) for step, metrics in logged
               if "throughput/window/images_per_sec" in metrics]
    assert windows == [(3, pytest.approx(10 / 1.0)), (5, pytest.approx(20 / 4.0))]
