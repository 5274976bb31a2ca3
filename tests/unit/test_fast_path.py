"""The speed options: batched augmentation, splits held on the device, channels_last, torch.compile, warm-up start."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from lightning.pytorch.plugins.precision import Precision

from datamodules.augment import (
    augmentation_seed,
    random_crop,
    random_horizontal_flip,
)
from datamodules.fashion_mnist import FashionMNISTDataModule
from lightning_modules.networks import FastCNN, GpuCNN, SmallCNN, StagedCNN
from tests.unit.conftest import classifier


def distinct_images(n: int = 64, size: int = 28) -> torch.Tensor:
    """uint8 images with no zero pixel, so every 0 in an augmented image comes from the padding."""
    return torch.randint(1, 256, (n, 1, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def shifted(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``image`` moved by (dy, dx) pixels, uncovered pixels 0: what RandomCrop(padding) makes of it."""
    out = torch.zeros_like(image)
    h, w = image.shape[-2:]
    out[..., max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = image[..., max(-dy, 0):h - max(dy, 0),
                                                                          max(-dx, 0):w - max(dx, 0)]
    return out


def fake_trainer(training: bool, batch: int = 0, epoch: int = 0, rank: int = 0):
    progress = SimpleNamespace(current=SimpleNamespace(ready=batch))
    return SimpleNamespace(training=training, global_rank=rank, current_epoch=epoch, precision_plugin=Precision(),
                           fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))


def multiply_adds(net: torch.nn.Module) -> int:
    """Multiply-adds of the convolutions and linear layers for one 1×28×28 image."""
    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(module, torch.nn.Conv2d):
            total += output.numel() * module.in_channels * module.kernel_size[0] * module.kernel_size[1] // module.groups
        elif isinstance(module, torch.nn.Linear):
            total += module.in_features * module.out_features

    handles = [m.register_forward_hook(count) for m in net.modules()]
    net.eval()(torch.zeros(1, 1, 28, 28))
    for handle in handles:
        handle.remove()
    return total


def test_random_crop_shifts_each_image_within_the_padding_and_fills_with_black():
    images = distinct_images()
    cropped = random_crop(images, 2, torch.Generator().manual_seed(7))
    assert cropped.shape == images.shape and cropped.dtype == torch.uint8
    offsets = set()
    for original, out in zip(images, cropped):
        matches = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3) if torch.equal(shifted(original, dy, dx), out)]
        assert len(matches) == 1, "each output must be its own image shifted by one offset in [-2, 2]"
        offsets.add(matches[0])
    assert len(offsets) > 10, "offsets are drawn per image, not once per batch"


def test_horizontal_flip_mirrors_about_half_of_the_images():
    images = distinct_images(400)
    flipped = random_horizontal_flip(images, torch.Generator().manual_seed(3))
    mirrored = [torch.equal(out, original.flip(-1)) for original, out in zip(images, flipped)]
    unchanged = [torch.equal(out, original) for original, out in zip(images, flipped)]
    assert all(m != u for m, u in zip(mirrored, unchanged))
    assert 160 < sum(mirrored) < 240


def test_augmentation_draws_depend_on_seed_rank_epoch_and_batch_only():
    seeds = {augmentation_seed(42, rank, epoch, batch) for rank in (0, 1) for epoch in (0, 1) for batch in (0, 1)}
    assert len(seeds) == 8
    images = distinct_images()
    again = [random_crop(images, 3, torch.Generator().manual_seed(augmentation_seed(42, 0, 1, 5))) for _ in (0, 1)]
    assert torch.equal(again[0], again[1]), "a resumed run must draw the same crops"


@pytest.mark.parametrize("training", [True, False])
def test_augmentation_applies_to_training_batches_only(training):
    data = FashionMNISTDataModule(random_crop_padding=2, horizontal_flip=True)
    data.trainer = fake_trainer(training)
    images = distinct_images()
    out, _ = data.on_after_batch_transfer((images, torch.zeros(64, dtype=torch.long)), 0)
    plain, _ = FashionMNISTDataModule().on_after_batch_transfer((images, torch.zeros(64, dtype=torch.long)), 0)
    assert out.dtype == torch.float32
    assert torch.equal(out, plain) != training


def test_splits_stay_in_host_memory_on_cpu(fashion_root):
    data = FashionMNISTDataModule(data_dir=str(fashion_root))
    data.setup("fit")
    assert data.train_set.device.type == "cpu" and data.test_set.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_splits_live_in_gpu_memory_and_batches_are_gathered_there(fashion_root):
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    data = FashionMNISTDataModule(data_dir=str(fashion_root))
    data.trainer = trainer
    data.setup("fit")
    images, targets = data.train_set.__getitems__([0, 5, 3])
    assert images.is_cuda and targets.is_cuda
    assert data._loader(data.train_set, 4).pin_memory is False


def test_channels_last_keeps_the_outputs_and_stores_weights_nhwc():
    torch.manual_seed(0)
    plain = classifier("cnn").eval()
    nhwc = classifier("cnn", channels_last=True).eval()
    nhwc.load_state_dict(plain.state_dict())
    conv = nhwc.net[0][3].weight  # 32 input channels (with 1 channel, NHWC and NCHW coincide)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = torch.randn(8, 1, 28, 28)
    torch.testing.assert_close(nhwc(images), plain(images), rtol=1e-4, atol=1e-5)


def test_compile_routes_the_forward_through_torch_compile_and_keeps_plain_checkpoint_keys(monkeypatch):
    """Wiring only: inductor takes minutes on 2 cores, so torch.compile is replaced by a recorder here;
    the real compilation is measured by `make bench BENCH_ARGS=--options` (docs/benchmarks.md)."""
    compiled = []

    def fake_compile(module, mode=None):
        compiled.append((module, mode))
        return lambda images: module(images) * 0 + 7.0

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = classifier("mlp", compile=True)
    assert torch.equal(model(torch.zeros(2, 1, 28, 28)), torch.full((2, 10), 7.0))
    model(torch.zeros(2, 1, 28, 28))
    assert compiled == [(model.net, None)], "compiled once, the network itself (not the LightningModule)"
    graphs = classifier("mlp", compile="reduce-overhead")
    graphs(torch.zeros(2, 1, 28, 28))
    assert compiled[-1] == (graphs.net, "reduce-overhead")  # a mode by name: CUDA graphs for a launch-bound step
    keys = set(model.state_dict())
    assert keys == set(classifier("mlp").state_dict())
    assert not any("_orig_mod" in key or "_compiled" in key for key in keys)


def test_flip_test_time_averages_the_logits_of_an_image_and_its_mirror():
    torch.manual_seed(0)
    plain = classifier("mlp").eval()
    tta = classifier("mlp", flip_test_time=True).eval()
    tta.load_state_dict(plain.state_dict())
    images = torch.randn(4, 1, 28, 28)
    expected = (plain(images) + plain(images.flip(-1))) / 2
    calls = []
    tta.net.register_forward_hook(lambda net, inputs, output: calls.append(len(inputs[0])))
    torch.testing.assert_close(tta.evaluation_logits(images), expected)
    assert calls == [8], "image and mirror in one forward: CUDA graphs overwrite a first call's output with a second's"
    torch.testing.assert_close(tta(images), plain(images)), "training forward is unchanged"
    assert not torch.allclose(plain.evaluation_logits(images), expected)


def test_fast_cnn_does_an_eighth_of_the_cnn_work_per_image():
    fast, cnn = FastCNN(), SmallCNN()
    assert fast.eval()(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert multiply_adds(fast) == pytest.approx(2.3e6, rel=0.03)
    assert multiply_adds(fast) < multiply_adds(cnn) / 8


def test_staged_cnn_is_built_from_its_stages_four_by_default_at_under_half_the_cnn_work():
    """record_cpu.yaml's network: (width, convolutions) per stage, each stage halving the map; 7.5 M multiply-adds."""
    record = StagedCNN()
    assert record.eval()(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert multiply_adds(record) == pytest.approx(7.52e6, rel=0.01)
    assert multiply_adds(record) < multiply_adds(SmallCNN()) / 2
    convs = [m for m in record.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 32, 64, 64, 128, 128]
    other = StagedCNN(stages=[(8, 1), (24, 3)])
    assert [c.out_channels for c in other.modules() if isinstance(c, nn.Conv2d)] == [8, 24, 24, 24]
    assert other[-1].in_features == 24 and other.eval()(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_gpu_cnn_spends_six_times_the_cnn_work_on_width():
    """fast_gpu.yaml's network: its docs quote 116 M multiply-adds per image, six times cnn's."""
    wide, cnn = GpuCNN(), SmallCNN()
    assert wide.eval()(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert multiply_adds(wide) == pytest.approx(116e6, rel=0.03)
    assert 5.5 < multiply_adds(wide) / multiply_adds(cnn) < 6.5




def test_the_models_plain_attributes_set_directly_and_its_parameters_buffers_and_modules_still_registered():
    """The classifier stores a plain value for an attribute it holds without nn.Module's table checks; everything
    else goes through them: a new parameter, buffer or submodule is registered and in state_dict as before."""
    model = classifier("mlp")
    model.some_name = "training_step"  # a new name: nn.Module's own path
    model.some_name, model.count = "validation_step", 3
    assert (model.some_name, model.count) == ("validation_step", 3) and "some_name" in vars(model)
    model.scale = nn.Parameter(torch.ones(2))
    model.register_buffer("seen", torch.zeros(1))
    model.seen = torch.ones(1)
    model.head = nn.Linear(2, 2)
    names = set(model.state_dict())
    assert {"scale", "seen", "head.weight"} <= names and "scale" not in vars(model) and "head" not in vars(model)
    model.head = None  # None for a submodule: nn.Module keeps the name as a module slot
    assert "head" in model._modules and model._modules["head"] is None and "head" not in vars(model)
