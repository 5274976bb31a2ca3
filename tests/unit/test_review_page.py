"""The review page (callbacks/review_page.py): its charts name only tags a run of that many ranks logs, each with a
point per window or a band, and the validation accuracy's interval. That each chart draws in a browser:
tests/test_review_page.py."""

import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from callbacks import PeakMemory, ThroughputReport
from callbacks.review_page import accuracy_interval, layout
from callbacks.run_record import MetricsCSV, read_rows
from callbacks.step_time import PARTS
from tests.unit.conftest import tiny_fit


def test_the_accuracy_interval_is_wilsons_and_stays_within_0_and_1():
    assert accuracy_interval(0.5, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)  # the textbook case
    low, high = accuracy_interval(0.9, 10_000)
    assert (low, high) == pytest.approx((0.8940, 0.9057), abs=1e-4)  # ± 0.6 % on Fashion-MNIST's 10,000 images
    assert accuracy_interval(1.0, 101) == pytest.approx((101 / (101 + 1.959964 ** 2), 1.0))


def charts(breakdown, ranks, flops=False, mfu=False):
    return {title for section in layout(breakdown, ranks, flops, mfu).values() for title in section}


def test_the_breakdowns_charts_are_its_parts_per_window_and_comm_and_wait_only_with_several_ranks():
    page = {"images/sec (all ranks)", "images/sec per device", "validation accuracy (95 % interval)",
            "loss (training, validation)"}
    assert charts(False, 4) == page
    assert charts(True, 2) == page | set(PARTS)
    assert charts(True, 1) == page | set(PARTS) - {"comm", "wait"}


def test_the_throughput_group_draws_achieved_flops_where_they_were_counted_and_mfu_where_the_peak_is_known_too():
    throughput = {"FLOP/s per device (achieved)": r"^throughput/window/flops_per_sec_per_device$",
                  "MFU (of one device's peak)": r"^throughput/window/mfu$"}
    for flops, mfu, shown in ((False, False, []), (True, False, ["FLOP/s per device (achieved)"]),
                              (True, True, list(throughput))):
        group = layout(False, 1, flops, mfu)["Throughput and accuracy"]
        assert {title: group[title][1] for title in shown} == {title: [throughput[title]] for title in shown}
        assert not set(throughput) - set(shown) & set(group)


def test_every_chart_names_tags_the_run_logged_and_the_band_holds_the_accuracy(fashion_root, tmp_path):
    logger = MetricsCSV(str(tmp_path), name="run", version=0)
    tiny_fit(fashion_root, tmp_path, [ThroughputReport(check_every_n_steps=2), PeakMemory()], logger=logger,
             max_epochs=2, log_every_n_steps=2)
    events = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    (config,) = events.Tensors("custom_scalars__config__")
    page = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    logged = events.Tags()["scalars"]
    titles = {chart.title for category in page.category for chart in category.chart}
    assert {"FLOP/s per device (achieved)", "MFU (of one device's peak)"} <= titles  # the CPU probe's peak
    for chart in (chart for category in page.category for chart in category.chart):
        if chart.HasField("margin"):
            (series,) = chart.margin.series
            tags = [series.value, series.lower, series.upper]
            assert set(tags) <= set(logged), (chart.title, tags, logged)
            acc, low, high = ([event.value for event in events.Scalars(tag)] for tag in tags)
            assert len(acc) == len(low) == 2 and all(lo < a <= hi for a, lo, hi in zip(acc, low, high))
        else:  # each pattern matches, and one series has a point per window: 4 or more in 2 epochs
            found = {pattern: [tag for tag in logged if re.search(pattern, tag)] for pattern in chart.multiline.tag}
            assert all(found.values()), (chart.title, found, logged)
            assert max(len(events.Scalars(tag)) for tags in found.values() for tag in tags) >= 4, (chart.title, found)
    assert not [tag for tag in logged if re.search(r"/(comm|wait)/|^comm/|slowest|_rank0$", tag)], logged  # one rank
    assert "memory/peak_mb" in logged
    assert "epoch" not in logged  # a column of metrics.csv, where the epochs are read
    assert {row["epoch"] for row in read_rows(tmp_path / "run" / "version_0" / "metrics.csv")} >= {"0.0", "1.0"}
