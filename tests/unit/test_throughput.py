"""Throughput arithmetic under a fake clock: all ranks' images over training time only."""

import pytest

from callbacks.run_record import EpochRecord
from callbacks.throughput import (
    EpochClock,
    EpochTiming,
    combine_ranks,
    format_epoch_line,
)


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
