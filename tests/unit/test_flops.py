"""Throughput against the hardware (callbacks/flops.py): the training FLOPs of an image as torch's counter gives them,
the device's peak (Lightning's table, the CPU probe, the key), and achieved FLOP/s and MFU in the record and the line."""

import copy

import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning.fabric.utilities.throughput import get_available_flops
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from callbacks import ThroughputReport
from callbacks.flops import cpu_peak, device_peak, training_flops
from callbacks.run_record import EpochRecord, MetricsCSV, RunRecord, read_rows
from callbacks.throughput import format_epoch_line
from fashion_mnist_dp.cli.checks import import_class
from fashion_mnist_dp.cli.shorthand import CLASS_NAMES
from tests.epoch_lines import epoch_mfus, parse_epoch_lines
from tests.unit.conftest import tiny_fit

# MLP(hidden=256), by hand: forward 2·(784·256 + 256·10) FLOPs, backward the same for the weights' gradients and
# 2·256·10 for the hidden layer's input gradient (the images need none).
MLP_FLOPS = 2 * (784 * 256 + 256 * 10) * 2 + 2 * 256 * 10


def network(name: str) -> nn.Module:
    return import_class(CLASS_NAMES["--model.network"][name])().to(memory_format=torch.channels_last)


@pytest.mark.parametrize("name", ["cnn", "fast_cnn", "resnet18"])
def test_an_images_training_flops_are_the_counters_own_over_a_real_batch_and_leave_the_network_as_it_was(name):
    net = network(name)
    before = copy.deepcopy(net.state_dict())
    real = copy.deepcopy(net)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(real(torch.randn(2, 1, 28, 28)), torch.tensor([3, 7])).backward()
    assert training_flops(net, batch=128) == counter.get_total_flops() / 2
    assert all(torch.equal(value, before[key]) for key, value in net.state_dict().items())  # batch-norm's stats too
    assert all(p.grad is None for p in net.parameters())


def test_the_mlps_training_flops_are_its_matrix_products_counted_by_hand_at_any_batch():
    assert training_flops(network("mlp"), batch=2) == training_flops(network("mlp"), batch=256) == MLP_FLOPS


def test_the_cpu_probe_begins_no_matmul_that_the_last_one_says_would_end_after_its_budget(monkeypatch):
    """A fake CPU doing 2 GFLOP/s: 3 matmuls of 128, 3 of 256 (56 ms), one of 512 (134 ms more); a second one of 512
    would end at 324 ms, past 300."""
    now, calls = [0.0], []

    def matmul(a, b):
        calls.append(len(a))
        now[0] += 2 * len(a) ** 3 / 2e9

    monkeypatch.setattr(torch, "mm", matmul)
    peak, seconds = cpu_peak(torch.float32, budget_s=0.3, clock=lambda: now[0])
    assert calls == [128] * 3 + [256] * 3 + [512]
    assert peak == pytest.approx(2e9) and seconds == pytest.approx(now[0]) and seconds <= 0.3


def test_the_cpu_probe_measures_a_peak_within_its_start_up_bound():
    peak, seconds = cpu_peak(torch.float32)
    assert peak > 1e8  # any CPU that trains does more than 0.1 GFLOP/s in a matmul
    # One-sided: the probe is start-up time of every CPU run, promised to be at most a second (docs/reporting.md).
    assert seconds < 1.0


def test_a_gpus_peak_is_lightnings_table_and_a_gpu_it_lacks_says_so(monkeypatch):
    cuda, bf16 = torch.device("cuda", 0), torch.bfloat16
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert device_peak(cuda, bf16, None) == (get_available_flops(cuda, bf16),
                                             "Lightning's table for NVIDIA H100 80GB HBM3 in bfloat16")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    peak, reason = device_peak(cuda, bf16, None)
    assert peak is None and reason.startswith("Lightning's table has none for NVIDIA H200 in bfloat16 (FLOPs not found")
    assert device_peak(cuda, bf16, 9.89e14) == (9.89e14, "from the peak_flops key")


def test_the_epoch_line_ends_with_the_mfu_only_where_the_peak_is_known():
    record = EpochRecord(1, 32.6354, 1835.549, 0.27812, 0.90349)
    workshop = "Epoch 1: Cumulative Time = 32.635, Images/sec = 1835.55, Val Loss = 0.278, Val Acc = 0.903"
    assert format_epoch_line(record) == workshop
    assert [format_epoch_line(record, mfu) for mfu in (0.314, 0.0314, 0.00314)] == [
        f"{workshop}, MFU = 31.4 %", f"{workshop}, MFU = 3.1 %", f"{workshop}, MFU = 0.31 %"]
    assert parse_epoch_lines(f"{workshop}, MFU = 3.1 %") == [EpochRecord(1, 32.635, 1835.55, 0.278, 0.903)]


@pytest.mark.parametrize("peak_flops", [2.5e11, None])
def test_mfu_in_metrics_csv_is_images_per_sec_times_the_flops_over_the_peak_in_the_same_row(
        fashion_root, tmp_path, capsys, peak_flops):
    """2 epochs of 8 steps, a window every 2: every window and epoch row holds its FLOP/s and MFU; the FLOPs and the
    peak are the run record's (hparams.yaml), the given one or the CPU probe's; the epoch line prints the same MFU."""
    logger = MetricsCSV(str(tmp_path), name="run", version=0)
    trainer = tiny_fit(fashion_root, tmp_path, [RunRecord(), ThroughputReport(peak_flops=peak_flops)], logger=logger,
                       max_epochs=2, log_every_n_steps=2)
    folder = tmp_path / "run" / "version_0"
    params = yaml.safe_load((folder / "hparams.yaml").read_text())
    assert params["train_flops_per_image"] == MLP_FLOPS
    peak = params["peak_flops"]
    assert peak == peak_flops if peak_flops else peak > 0 and params["peak_flops_from"].startswith("a float32 matmul")
    rows = read_rows(folder / "metrics.csv")
    for prefix, count in (("throughput/window/", 8), ("throughput/", 2)):
        measured = [row for row in rows if row.get(f"{prefix}images_per_sec_per_device")]
        assert len(measured) == count and all(row[f"{prefix}mfu"] for row in measured)
        for row in measured:
            achieved = float(row[f"{prefix}images_per_sec_per_device"]) * MLP_FLOPS
            assert float(row[f"{prefix}flops_per_sec_per_device"]) == pytest.approx(achieved, rel=1e-12)
            assert float(row[f"{prefix}mfu"]) == pytest.approx(achieved / peak, rel=1e-12)
    epochs = [float(row["throughput/mfu"]) for row in rows if row.get("throughput/mfu")]
    printed = epoch_mfus(capsys.readouterr().out)
    assert len(printed) == 2 and printed == pytest.approx(epochs, abs=5.01e-4)  # a tenth of a per cent
    notes = next(c for c in trainer.callbacks if isinstance(c, ThroughputReport)).start_lines(trainer)
    assert "  training FLOPs  : 818.2 kFLOP an image, forward and backward (FlopCounterMode on the meta device" in \
        "\n".join(notes)


class ReadsItsInput(nn.Module):
    """A forward that needs the images' values (a host read), which the meta device does not have."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(28 * 28, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.linear(images.flatten(1)) * (1.0 if float(images.abs().sum()) >= 0 else 0.0)


def test_a_network_the_counter_cannot_run_gives_a_line_and_the_run_goes_on_without_the_figures(
        fashion_root, tmp_path, capsys):
    logger = MetricsCSV(str(tmp_path), name="run", version=0)
    trainer = tiny_fit(fashion_root, tmp_path, [RunRecord(), ThroughputReport()], network=ReadsItsInput(),
                       logger=logger, log_every_n_steps=2)
    report = next(c for c in trainer.callbacks if isinstance(c, ThroughputReport))
    (line,) = [note for note in report.start_lines(trainer) if "FLOP" in note]
    assert line.startswith(f"  training FLOPs  : not counted: FlopCounterMode cannot run {__name__}.ReadsItsInput "
                           "on the meta device (") and line.endswith("); no FLOP/s or MFU figures")
    folder = tmp_path / "run" / "version_0"
    columns = set(read_rows(folder / "metrics.csv")[0])
    assert "throughput/window/images_per_sec" in columns and not [c for c in columns if "flops" in c or "mfu" in c]
    assert yaml.safe_load((folder / "hparams.yaml").read_text())["train_flops_per_image"] is None
    assert epoch_mfus(capsys.readouterr().out) == [None]
