"""A short fit on tiny data, run as a user runs it: epoch lines, start block, checkpoints, TensorBoard, resume."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.flops import si, training_flops
from callbacks.run_record import read_epochs, read_rows
from lightning_modules.networks import SmallCNN
from tests.epoch_lines import epoch_mfus, parse_epoch_lines
from tests.conftest import run_dir, run_train


def scalars(log_dir):
    """tag -> [(step, value)] over every event file of one TensorBoard run folder."""
    found = {}
    for events in sorted(log_dir.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return found


def epoch_lines(stdout):
    """The epoch lines, read by the formatter's own parser (callbacks/throughput.py); every line that starts with
    "Epoch " must be one."""
    parsed = parse_epoch_lines(stdout)
    assert len(parsed) == sum(line.startswith("Epoch ") for line in stdout.splitlines()), stdout
    return parsed


VALIDATION_SLEEP_S = 3.0


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, fashion_root):
    cwd = tmp_path_factory.mktemp("run")
    args = ["--data_dir", str(fashion_root), "--epochs", "2", "--batch_size", "32", "--lr", "0.1",
            "--trainer.accumulate_grad_batches", "2", "--warmup_epochs", "0.5", "--trainer.log_every_n_steps", "1",
            "--trainer.callbacks+=tests.recorder.SlowValidation",
            f"--trainer.callbacks.init_args.seconds={VALIDATION_SLEEP_S}"]
    result = run_train(args, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd, result


@pytest.mark.oldest
def test_prints_one_workshop_line_per_epoch(first_run):
    _, result = first_run
    lines = epoch_lines(result.stdout)
    assert [m is not None for m in lines] == [True, True], result.stdout
    assert [m.epoch for m in lines] == [1, 2]
    cumulative = [m.cumulative_s for m in lines]
    assert 0 < cumulative[0] < cumulative[1]
    assert all(m.images_per_sec > 0 for m in lines)


def test_training_time_excludes_validation(first_run):
    cwd, _ = first_run
    found = scalars(run_dir(cwd))
    # Each validation pass (twice an epoch: mid-epoch and at its end) sleeps VALIDATION_SLEEP_S. Counted, the one
    # mid-epoch would sit in the data wait (between two batches) and the last in the epoch's time after its last
    # batch: each of those stays below one pass's sleep, however slow the steps themselves (compute) are under load.
    for step_epoch_s, step_data, step_compute in zip(found["time/epoch_s"], found["time/data_wait_s"], found["time/compute_s"]):
        epoch_s, data_wait_s, compute_s = step_epoch_s[1], step_data[1], step_compute[1]
        after_last_batch_s = epoch_s - data_wait_s - compute_s
        assert data_wait_s < VALIDATION_SLEEP_S, (epoch_s, data_wait_s, compute_s)
        assert -1e-4 < after_last_batch_s < VALIDATION_SLEEP_S, (epoch_s, data_wait_s, compute_s)  # float32 events
    assert found["time/cumulative_s"][-1][1] == pytest.approx(sum(v for _, v in found["time/epoch_s"]), rel=1e-5)


@pytest.mark.oldest
def test_start_block_shows_effective_batch_and_scaled_lr(first_run):
    _, result = first_run
    log = result.stdout + result.stderr
    assert "32 per device x 1 x 1 x accumulate 2 = effective 64" in log
    assert "base 0.1 at batch 32 -> 0.2 (linear scaling)" in log
    assert "warm-up         : 2 optimizer steps (4 per epoch), then constant" in log


@pytest.mark.oldest
def test_writes_best_and_last_checkpoints(first_run):
    cwd, _ = first_run
    checkpoints = run_dir(cwd) / "checkpoints"
    names = sorted(p.name for p in checkpoints.glob("*.ckpt"))
    assert "last.ckpt" in names
    assert any(re.fullmatch(r"best-epoch0[01]-acc\d\.\d{4}\.ckpt", n) for n in names), names


@pytest.mark.oldest
def test_tensorboard_has_the_documented_tags_and_the_warmup_lr(first_run):
    cwd, _ = first_run
    folder = run_dir(cwd)
    found = scalars(folder)
    for tag in ["train/loss", "val/loss", "val/acc", "test/acc", "throughput/images_per_sec",
                "throughput/images_per_sec_per_device", "time/epoch_s", "time/cumulative_s",
                "time/data_wait_s", "time/compute_s", "memory/peak_mb", "lr-SGD/pg1"]:
        assert tag in found, f"{tag} missing from {sorted(found)}"
    by_step = dict(found["lr-SGD/pg1"])  # logged per batch: with accumulation, twice per optimizer step
    lr = [round(by_step[step], 6) for step in range(4)]
    assert lr == [0.1, 0.15, 0.2, 0.2]  # warm-up from base_lr to the scaled lr over 2 optimizer steps
    assert (folder / "config.yaml").is_file() and "effective_batch_size: 64" in (folder / "hparams.yaml").read_text()


@pytest.mark.oldest
def test_the_test_after_fit_puts_its_pictures_and_per_class_accuracy_in_tensorboard(first_run):
    cwd, result = first_run
    images, found = {}, scalars(run_dir(cwd))
    for events in run_dir(cwd).glob("events.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
        accumulator.Reload()
        images.update({tag: accumulator.Images(tag) for tag in accumulator.Tags()["images"]})
    assert sorted(images) == ["test/confusion_matrix", "test/misclassified"]
    assert all(len(shots) == 1 and shots[0].width > 300 for shots in images.values())
    per_class = {tag: values for tag, values in found.items() if tag.startswith("test/acc_class/")}
    assert len(per_class) == 10 and "test/acc_class/T-shirt-top" in per_class
    assert all(0 <= values[0][1] <= 1 for values in per_class.values())


@pytest.mark.oldest
def test_tensorboard_hparams_tab_holds_the_derived_run_facts(first_run):
    cwd, _ = first_run
    (events,) = [p for p in run_dir(cwd).glob("events.*")
                 if b"_hparams_/session_start_info" in p.read_bytes()]
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    content = accumulator.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    for fact in (b"effective_batch_size", b"scaled_lr", b"world_size", b"warmup_steps", b"backend",
                 b"train_flops_per_image", b"peak_flops"):
        assert fact in content


@pytest.mark.oldest
def test_start_block_names_the_training_flops_and_every_epoch_line_ends_with_the_record_mfu(first_run):
    """The default network's FLOPs as torch's counter gives them, in the start block and hparams.yaml; the CPU
    probe's peak; each epoch line's MFU is the one in metrics.csv (2 epochs, one device)."""
    cwd, result = first_run
    flops = training_flops(SmallCNN())
    log = result.stdout + result.stderr
    assert f"  training FLOPs  : {si(flops, 'FLOP')} an image, forward and backward (FlopCounterMode" in log
    assert re.search(r"  peak FLOP/s     : [\d.]+ [GT]FLOP/s per device, a float32 matmul on \d+ thread\(s\), "
                     r"measured at start-up in [\d.]+ s", log), log
    folder = run_dir(cwd)
    assert yaml.safe_load((folder / "hparams.yaml").read_text())["train_flops_per_image"] == flops
    epochs = [float(row["throughput/mfu"]) for row in read_rows(folder / "metrics.csv") if row.get("throughput/mfu")]
    assert len(epochs) == 2 and epoch_mfus(result.stdout) == pytest.approx(epochs, abs=5.01e-4)


@pytest.mark.oldest
def test_resume_from_last_continues_at_the_next_epoch(first_run, fashion_root):
    cwd, _ = first_run
    result = run_train(["--data_dir", str(fashion_root), "--epochs", "3", "--batch_size", "32",
                        "--trainer.accumulate_grad_batches", "2", "--lr", "0.1", "--ckpt_path", "last",
                        "--test_after_fit", "false"], cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [m.epoch for m in epoch_lines(result.stdout)] == [3]
    assert "Restoring states from the checkpoint path at" in result.stderr + result.stdout
    assert "test/acc" not in result.stdout


def test_predict_writes_one_csv_row_per_test_image(first_run, fashion_root):
    cwd, _ = first_run
    last = run_dir(cwd) / "checkpoints" / "last.ckpt"
    result = run_train(["predict", "--data_dir", str(fashion_root), "--ckpt_path", str(last)], cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (csv_path,) = (cwd / "runs").glob("*/*-predict/predictions.csv")  # in predict's own run folder
    rows = [line.split(",") for line in csv_path.read_text().splitlines()]
    assert rows[0] == ["index", "class_id", "class_name"]
    assert [int(r[0]) for r in rows[1:]] == list(range(101))
    assert all(0 <= int(r[1]) <= 9 and r[2] for r in rows[1:])


def test_missing_checkpoint_is_one_line_and_exit_66(workdir, fashion_root):
    result = run_train(["test", "--data_dir", str(fashion_root), "--ckpt_path", "nope.ckpt"], cwd=workdir)
    assert result.returncode == 66
    assert "train.py: error: checkpoint not found: nope.ckpt" in result.stderr
    assert "Traceback" not in result.stderr


def test_installed_console_script_is_train_py(workdir):
    script = Path(sys.executable).parent / "fashion-mnist-train"
    result = subprocess.run([str(script), "--epochs", "4", "--print_config"], cwd=workdir, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "max_epochs: 4" in result.stdout


def test_a_stop_mid_epoch_prints_n_a_for_the_validation_it_did_not_run(workdir, fashion_root):
    """max_steps 10 at 8 steps per epoch: epoch 2 stops after 2 steps, and no validation runs in it."""
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--batch_size", "32", "--epochs", "3",
                        "--trainer.max_steps", "10", "--test_after_fit", "false"], cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = epoch_lines(result.stdout)
    assert first.val_acc is not None and (second.epoch, second.val_loss, second.val_acc) == (2, None, None)
    records = read_epochs(run_dir(workdir))
    assert [(r.epoch, r.val_acc is None) for r in records] == [(1, False), (2, True)]
    assert f"{records[1].cumulative_s:.3f}" == f"{second.cumulative_s:.3f}"


@pytest.mark.parametrize("devices", [[], ["--data.virtual_devices", "4"]], ids=["one device", "4 devices' lr"])
def test_the_workshops_network_trains_as_typed(fashion_root, tmp_path, devices):
    """``--network wrn`` and nothing else brings its own known-good lr (configs/networks/wrn.yaml): 30 optimizer steps
    with a finite, falling loss, on one device and at the lr scaled for 4 (virtual devices: the effective batch and the
    LR rule of ``--strategy ddp --devices 4``). At SGD's 0.05 it diverged (exit 70) at step 18, and at step 6 for 4.
    The batch is 4 per device, so that 30 steps of the 17 M-parameter network fit a 2-core CPU."""
    args = ["--network", "wrn", "--data_dir", str(fashion_root), "--batch_size", "4", *devices,
            "--trainer.max_steps", "30", "--trainer.log_every_n_steps", "5", "--check_every_n_steps", "5",
            "--trainer.limit_val_batches", "0", "--test_after_fit", "false"]
    result = run_train(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "lr from         : --network wrn (configs/networks/wrn.yaml) (--lr sets another)" in result.stderr
    rows = read_rows(run_dir(tmp_path) / "metrics.csv")
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses), losses  # steps 5, 10, ..., 30
    assert sum(losses[-2:]) < sum(losses[:2]), losses
