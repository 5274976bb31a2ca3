"""Fashion-MNIST files: where they are looked for, what a missing file says, and how batches are served."""

import torch

from datamodules import FashionMNISTDataModule
from datamodules.fashion_mnist import RAW_FILES, InMemoryImages, PIXEL_MEAN, PIXEL_STD, default_data_dir, torchvision_root
from tests.conftest import run_train
from tests.idx_files import sample_ids


def test_data_dir_comes_from_flag_then_environment_then_dot_data(monkeypatch, tmp_path):
    monkeypatch.delenv("FASHION_MNIST_DIR", raising=False)
    assert default_data_dir() == "data"
    monkeypatch.setenv("FASHION_MNIST_DIR", str(tmp_path))
    assert FashionMNISTDataModule().data_dir == str(tmp_path)
    assert FashionMNISTDataModule(data_dir="elsewhere").data_dir == "elsewhere"


def test_data_dir_may_name_the_root_the_dataset_folder_or_raw(fashion_root):
    for given in (fashion_root, fashion_root / "FashionMNIST", fashion_root / "FashionMNIST" / "raw"):
        assert torchvision_root(str(given)) == fashion_root
        assert FashionMNISTDataModule(data_dir=str(given), download=False).missing_files() == []


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


def test_missing_files_without_download_give_one_line_naming_folder_and_files(workdir):
    empty = workdir / "empty"
    result = run_train(["--data_dir", str(empty), "--data.download", "false"], cwd=workdir)
    assert result.returncode == 65
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1, result.stderr
    assert str(empty / "FashionMNIST" / "raw") in errors[0]
    assert all(name in errors[0] for name in RAW_FILES)
    assert "Traceback" not in result.stderr
    assert not (workdir / "runs").exists()
