"""Fashion-MNIST files: where they are looked for, what a damaged file says, the held-out validation split, and how
batches are served."""

import csv
import gzip
import struct
import tempfile
import time
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from fashion_mnist_dp.cli import app as train
from fashion_mnist_dp.cli.app import main
from datamodules import FashionMNISTDataModule
from datamodules.fashion_mnist import PIXEL_MEAN, PIXEL_STD
from datamodules.files import CorruptDataError, default_data_dir, torchvision_root
from datamodules.in_memory import InMemoryImages, stratified_holdout
from tests.idx_files import sample_ids


def normalised(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255 - PIXEL_MEAN) / PIXEL_STD

# Each way an IDX file can be damaged: (file, how, what the one line must say). torchvision 0.29 accepts the
# label-count and label-value cases (training then fails mid-epoch or silently drops images), and fails on the
# others with messages that name neither the file nor the problem (datamodules/files.py).
def _header(magic: int, *dims: int) -> bytes:
    return struct.pack(f">I{len(dims)}I", magic, *dims)


CORRUPTIONS = {
    "empty": ("t10k-labels-idx1-ubyte", lambda b: b"", "is empty (0 bytes)"),
    "header-cut": ("train-labels-idx1-ubyte", lambda b: b[:6], "is 6 bytes, shorter than its 8-byte header"),
    "images-truncated": ("train-images-idx3-ubyte", lambda b: b[: len(b) // 2],
                         "truncated: 100360 bytes, expected 200720 (16-byte header + 256×28×28)"),
    "trailing-bytes": ("t10k-images-idx3-ubyte", lambda b: b + b"extra", "has trailing bytes: 79205 bytes, expected 79200"),
    "still-gzipped": ("train-images-idx3-ubyte", lambda b: gzip.compress(b), "is still gzip-compressed"),
    "wrong-magic": ("train-images-idx3-ubyte", lambda b: _header(0x801, 256, 28, 28) + b[8:],
                    "bad magic number 0x00000801, expected 0x00000803"),
    "not-28x28": ("t10k-images-idx3-ubyte", lambda b: _header(0x803, 101, 32, 24) + b[16:16 + 101 * 32 * 24].ljust(101 * 32 * 24, b"\0"),
                  "images are 32×24 pixels, expected 28×28"),
    "fewer-labels": ("train-labels-idx1-ubyte", lambda b: _header(0x801, 200) + b[8:208],
                     "holds 200 labels but train-images-idx3-ubyte holds 256 images"),
    "labels-truncated": ("train-labels-idx1-ubyte", lambda b: b[:-50], "truncated: 214 bytes, expected 264"),
    "label-out-of-range": ("t10k-labels-idx1-ubyte", lambda b: b[:8 + 7] + bytes([99]) + b[8 + 8:],
                           "label 99 at index 7 is outside 0..9"),
}

def test_data_dir_comes_from_flag_then_environment_then_dot_data(monkeypatch, tmp_path):
    monkeypatch.delenv("FASHION_MNIST_DIR", raising=False)
    assert default_data_dir() == "data"
    monkeypatch.setenv("FASHION_MNIST_DIR", str(tmp_path))
    assert FashionMNISTDataModule().data_dir == str(tmp_path)
    assert FashionMNISTDataModule(data_dir="elsewhere").data_dir == "elsewhere"


def test_data_dir_may_name_the_root_the_dataset_folder_or_raw(fashion_root):
    for given in (fashion_root, fashion_root / "FashionMNIST", fashion_root / "FashionMNIST" / "raw"):
        assert torchvision_root(str(given)) == fashion_root
        FashionMNISTDataModule(data_dir=str(given), download=False).prepare_data()  # finds and checks the files


def test_train_split_is_one_uint8_tensor_and_a_batch_is_one_gather(fashion_root):
    dm = FashionMNISTDataModule(data_dir=str(fashion_root), batch_size=32, download=False)
    dm.setup("fit")
    assert dm.train_set.images.dtype == torch.uint8 and dm.train_set.images.shape == (256, 1, 28, 28)
    assert len(dm.test_set) == 101
    images, targets = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (32, 1, 28, 28) and targets.shape == (32,)
    normalised, same_targets = dm.on_after_batch_transfer((images, targets), 0)
    assert normalised.dtype == torch.float32 and torch.equal(same_targets, targets)
    expected = (images.float() / 255 - PIXEL_MEAN) / PIXEL_STD
    assert torch.allclose(normalised, expected, atol=1e-6)
    ids = sample_ids(normalised)
    assert torch.equal(dm.train_set.targets[ids], targets)  # each image still has its own label


def test_getitems_serves_exactly_the_requested_samples():
    images = torch.arange(5 * 28 * 28, dtype=torch.int64).reshape(5, 28, 28).to(torch.uint8)
    data = InMemoryImages(images, torch.tensor([0, 1, 2, 3, 4]))
    batch_images, batch_targets = data.__getitems__([4, 1])
    assert batch_targets.tolist() == [4, 1]
    assert torch.equal(batch_images[:, 0], images[[4, 1]])


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_damaged_file_gives_one_line_naming_file_and_problem_exit_65(capsys, workdir, damaged_copy, kind):
    name, damage, problem = CORRUPTIONS[kind]
    path = damaged_copy / "FashionMNIST" / "raw" / name
    path.write_bytes(damage(path.read_bytes()))
    started = time.monotonic()
    code = train.main(["--data_dir", str(damaged_copy), "--data.download", "false", "--epochs", "1"])
    assert time.monotonic() - started < 10  # after imports: parse, build, check (the check itself takes ms)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert code == 65
    assert len(errors) == 1 and f"{path.resolve()}: {problem}" in errors[0], err
    assert "Traceback" not in err
    assert not (workdir / "runs").exists()  # found before anything was written


def test_one_missing_file_is_named(capsys, workdir, damaged_copy):
    (damaged_copy / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    code = train.main(["--data_dir", str(damaged_copy), "--data.download", "false"])
    err = capsys.readouterr().err
    assert code == 65 and "missing t10k-labels-idx1-ubyte and download is disabled" in err, err


def test_setup_checks_the_files_on_every_rank(damaged_copy):
    """A rank whose node holds a damaged copy (prepare_data ran elsewhere) stops in setup, not mid-epoch."""
    path = damaged_copy / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:8] + bytes([10]) + path.read_bytes()[9:])
    dm = FashionMNISTDataModule(data_dir=str(damaged_copy), download=False)
    with pytest.raises(CorruptDataError, match="label 10 at index 0 is outside 0..9"):
        dm.setup("fit")




def test_the_held_out_split_is_disjoint_stratified_and_the_same_every_time():
    labels = torch.arange(1000) % 10
    labels[:37] = 3  # uneven classes
    kept, held = stratified_holdout(labels, 101)
    assert len(held) == 101 and len(kept) == 899 and set(kept.tolist()).isdisjoint(held.tolist())
    assert sorted(kept.tolist() + held.tolist()) == list(range(1000))
    counts = torch.bincount(labels, minlength=10)
    for cls, n in enumerate(torch.bincount(labels[held], minlength=10).tolist()):
        assert abs(n - counts[cls].item() * 101 / 1000) < 1, (cls, n)
    again_kept, again_held = stratified_holdout(labels, 101)
    assert torch.equal(held, again_held) and torch.equal(kept, again_kept)
    with pytest.raises(MisconfigurationException, match="data.val_size is 1000: hold out from 0 to 999"):
        stratified_holdout(labels, 1000)


def held_out_and_trained(fashion_root, world_size: int, **data_args):
    """The sample ids every rank validates on and trains on, and the held-out class counts."""
    seen_val, seen_train = [], []
    for rank in range(world_size):
        data = FashionMNISTDataModule(data_dir=str(fashion_root), val_size=40, eval_batch_size=7, download=False,
                                      **data_args)
        data.trainer = SimpleNamespace(world_size=world_size, global_rank=rank,
                                       strategy=SimpleNamespace(root_device=torch.device("cpu")), training=False)
        data.setup("fit")
        assert not data.validates_on_test_split and len(data.train_set) == 256 - 40
        seen_val += [i for images, _ in data.val_dataloader() for i in sample_ids(normalised(images))]
        seen_train += [i for images, _ in data.train_dataloader() for i in sample_ids(normalised(images))]
    return seen_val, seen_train, torch.bincount(data.val_set.targets, minlength=10).tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("val_seed", [0, 1])
def test_validation_on_held_out_images_sees_each_once_and_none_of_them_is_trained_on(fashion_root, world_size,
                                                                                    val_seed):
    seen_val, seen_train, _ = held_out_and_trained(fashion_root, world_size, val_seed=val_seed)
    assert sorted(seen_val) == sorted(set(seen_val)) and len(seen_val) == 40  # each held-out image once
    assert set(seen_val).isdisjoint(seen_train) and len(set(seen_train)) == 216


def test_val_seed_holds_out_another_set_with_the_same_classes_and_zero_is_the_default(fashion_root):
    default, _, default_counts = held_out_and_trained(fashion_root, 1)
    zero, _, _ = held_out_and_trained(fashion_root, 1, val_seed=0)
    sets = [set(held_out_and_trained(fashion_root, 1, val_seed=seed)[0]) for seed in (1, 2)]
    assert default == zero
    assert set(default) != sets[0] and set(default) != sets[1] and sets[0] != sets[1]
    assert held_out_and_trained(fashion_root, 2, val_seed=1)[2] == default_counts  # stratified alike, any world size


def test_the_test_after_fit_uses_the_last_epoch_when_validation_is_the_test_split(capsys, workdir, fashion_root):
    args = ["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "2"]
    assert main(args) == 0
    assert "train.py: testing the last epoch's weights: validation used the test split" in capsys.readouterr().out
    assert main([*args, "--data.val_size", "50"]) == 0
    assert "testing the last epoch" not in capsys.readouterr().out  # the best by val/acc on held-out images


@pytest.mark.parametrize("subset, val_size, refused", [(256, 0, False), (257, 0, True), (192, 64, False),
                                                      (193, 64, True)])
def test_train_subset_accepts_every_training_image_left_and_not_one_more(fashion_root, subset, val_size, refused):
    """The tiny data has 256 training images; --data.val_size holds some out first. prepare_data (which the launching
    process runs before anything is written) and every rank's setup draw the line at the same count."""
    dm = FashionMNISTDataModule(data_dir=str(fashion_root), download=False, train_subset=subset, val_size=val_size)
    message = rf"--data.train_subset {subset} is more than the {256 - val_size} training images"
    for check in (dm.prepare_data, lambda: dm.setup("fit")):
        if refused:
            with pytest.raises(MisconfigurationException, match=message):
                check()
        else:
            check()
    if not refused:
        assert len(dm.train_set) == subset


def test_the_worker_guards_are_the_data_modules_own_arguments_given_to_its_loaders(fashion_root, capsys, workdir):
    """configs/default.yaml names them (no callback injects them any more); a bad import path is one line, exit 2."""
    guarded = FashionMNISTDataModule(data_dir=str(fashion_root), num_workers=1, worker_timeout=7.5,
                                     worker_init_fn="fashion_mnist_dp.runtime.signals.init_data_worker")
    guarded.setup("fit")
    loader = guarded.val_dataloader()
    from fashion_mnist_dp.runtime.signals import init_data_worker
    assert (loader.timeout, loader.worker_init_fn) == (7.5, init_data_worker)
    plain = FashionMNISTDataModule(data_dir=str(fashion_root), worker_timeout=7.5,
                                   worker_init_fn="fashion_mnist_dp.runtime.signals.init_data_worker")
    plain.setup("fit")
    assert (plain.val_dataloader().timeout, plain.val_dataloader().worker_init_fn) == (0, None)  # no workers
    with pytest.raises(ValueError, match="worker_init_fn 'nowhere.fn' cannot be imported: No module named 'nowhere'"):
        FashionMNISTDataModule(worker_init_fn="nowhere.fn")
    assert main(["--data_dir", str(fashion_root), "--data.worker_init_fn", "os", "--epochs", "1"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("train.py: error: worker_init_fn 'os' is not an import path "
                                                        "of a function (package.module.function) (see python "
                                                        "train.py --help)")


def test_a_temp_folder_too_long_for_workers_sockets_is_one_line_before_any_worker_starts(fashion_root, capsys,
                                                                                         workdir, monkeypatch):
    """75 bytes is the longest under which a worker can bind its socket (measured: at 76 its batch never comes and
    the rank waited out --data.worker_timeout, then blamed data.worker_init_fn)."""
    from datamodules.workers import check_workers
    monkeypatch.setattr(tempfile, "tempdir", "/" + "t" * 74)
    check_workers(1, None, "", None)
    monkeypatch.setattr(tempfile, "tempdir", "/" + "t" * 75)
    check_workers(0, None, "", None)  # no workers, no sockets
    assert main(["--data_dir", str(fashion_root), "--data.num_workers", "2", "--epochs", "1"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"train.py: error: data loader workers cannot use the temp folder /{'t' * 75} (76 bytes): their sockets go "
        "there, and a Unix socket's path holds 107 bytes; set TMPDIR to a folder of at most 75 bytes (e.g. /tmp), or "
        "--data.num_workers 0 (see python train.py --help)")
    assert not (workdir / "runs").exists()


def test_how_often_a_run_validates_does_not_change_how_it_trains(workdir, fashion_root):
    """cnn's dropout draws from torch's global generator, from which a DataLoader also draws at every pass: the
    evaluation loaders have their own, so validating four times an epoch trains the same weights as once."""
    weights = []
    for run, validation in enumerate([["--trainer.num_sanity_val_steps", "0"],
                                      ["--trainer.val_check_interval", "0.25"]]):
        args = ["--data_dir", str(fashion_root), "--network", "cnn", "--epochs", "1", "--batch_size", "32",
                "--test_after_fit", "false", "--trainer.default_root_dir", f"runs{run}", *validation]
        assert main(args) == 0
        last, = (workdir / f"runs{run}").rglob("last.ckpt")
        weights.append(torch.load(last, weights_only=True)["state_dict"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


@pytest.mark.parametrize("interval, steps", [("0.5", [4, 10]), ("1.0", [10])])
def test_an_epoch_validates_after_its_last_batch_whatever_the_share_of_batches_between_validations(
        workdir, fashion_root, interval, steps):
    """256 images at 24 are 11 batches; at 0.5 Lightning validates after batches 5 and 10, here after 5 and 11 (the
    last share ends with the last batch), so the epoch's line and checkpoints hold the validation of its last weights
    (steps counted from 0)."""
    args = ["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "1", "--batch_size", "24",
            "--test_after_fit", "false", "--trainer.val_check_interval", interval]
    assert main(args) == 0
    metrics, = workdir.rglob("metrics.csv")
    rows = [row for row in csv.DictReader(metrics.open()) if row.get("val/acc")]
    assert [int(row["step"]) for row in rows] == steps
