"""airbench's model options: identity (Dirac) init of the convolutions, frozen batch-norm scales, patch-whitening
init of the first convolution."""

import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback

from datamodules import FashionMNISTDataModule
from lightning_modules import FashionMNISTClassifier
from lightning_modules.networks import first_convolution, init_first_conv_as_whitening, patch_whitening_filters
from tests.unit.conftest import tiny_fit


def test_dirac_init_makes_each_convolution_pass_its_input_channels_through_on_its_first_filters():
    torch.manual_seed(0)
    plain = FashionMNISTClassifier(network="fast_cnn", channels_last=False).net
    torch.manual_seed(0)
    net = FashionMNISTClassifier(network="fast_cnn", channels_last=False, dirac_init=True).net
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(1, 16), (16, 64)]
    for conv, before in zip(convs, [m for m in plain.modules() if isinstance(m, torch.nn.Conv2d)]):
        x = torch.randn(3, conv.in_channels, 14, 14)
        torch.testing.assert_close(conv(x)[:, :conv.in_channels], x)  # identity on the first in_channels filters
        torch.testing.assert_close(conv.weight[conv.in_channels:], before.weight[conv.in_channels:])  # rest as drawn


def test_frozen_norm_weights_stay_1_while_their_biases_and_the_convolutions_train(fashion_root, tmp_path):
    trainer = tiny_fit(fashion_root, tmp_path, network="fast_cnn", model_args=dict(freeze_norm_weights=True))
    norms = [m for m in trainer.lightning_module.net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 2
    assert all(torch.equal(n.weight, torch.ones_like(n.weight)) for n in norms)
    assert all(not torch.equal(n.bias, torch.zeros_like(n.bias)) for n in norms)  # the biases trained
    trained = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert not any(id(n.weight) in trained for n in norms)


def test_whitening_filters_are_the_patch_eigenvectors_scaled_to_unit_variance_and_negated(fashion_root):
    data = FashionMNISTDataModule(data_dir=str(fashion_root), download=False)
    data.setup("fit")
    images = data.normalised_train_images(5000)
    net = FashionMNISTClassifier(network="fast_cnn", channels_last=True).net
    assert init_first_conv_as_whitening(net, images) == 8  # 16 filters: the 8 largest of 9 directions, both signs
    weight = first_convolution(net).weight.detach().double().reshape(16, 9)
    # Independently: the right singular vectors of the 3×3 patch matrix, largest first.
    patches = torch.nn.functional.unfold(images.double(), 3).transpose(1, 2).reshape(-1, 9)
    _, singular, directions = torch.linalg.svd(patches, full_matrices=False)
    variances = singular ** 2 / len(patches)
    norms = weight[:8].norm(dim=1)
    torch.testing.assert_close(norms, 1 / torch.sqrt(variances[:8] + 5e-4))
    cosines = (weight[:8] / norms[:, None] * directions[:8]).sum(dim=1).abs()
    torch.testing.assert_close(cosines, torch.ones(8, dtype=torch.double))
    torch.testing.assert_close(weight[8:], -weight[:8])
    # So the first layer's outputs (without padding) start uncorrelated, each at unit variance.
    outputs = torch.nn.functional.conv2d(images, first_convolution(net).weight[:8]).transpose(0, 1).reshape(8, -1)
    moment = (outputs.double() @ outputs.double().T) / outputs.shape[1]
    torch.testing.assert_close(moment, torch.diag(variances[:8] / (variances[:8] + 5e-4)), atol=1e-3, rtol=1e-3)


def test_fit_with_whitening_init_starts_from_the_training_images_whitening(fashion_root, tmp_path):
    started = {}

    class RecordStart(Callback):
        def on_train_start(self, trainer, module):
            started["weight"] = first_convolution(module.net).weight.detach().clone()
            started["images"] = trainer.datamodule.normalised_train_images(5000)

    tiny_fit(fashion_root, tmp_path, callbacks=[RecordStart()], network="fast_cnn",
             model_args=dict(whitening_init=True))
    filters = patch_whitening_filters(started["images"], 3)
    torch.testing.assert_close(started["weight"][:8], filters[:8])
    torch.testing.assert_close(started["weight"][8:], -filters[:8])


def test_whitening_init_of_a_network_without_convolutions_is_refused_in_one_line():
    with pytest.raises(MisconfigurationException, match="whitening_init needs a convolutional network; mlp"):
        FashionMNISTClassifier(network="mlp", whitening_init=True)


@pytest.mark.parametrize("flip", [False, True])
def test_translate_test_time_averages_the_image_with_its_one_pixel_shifts_half_and_half(flip):
    torch.manual_seed(0)
    model = FashionMNISTClassifier(network="mlp", flip_test_time=flip, translate_test_time=True).eval()
    images = torch.randn(4, 1, 28, 28)
    back, ahead = torch.arange(-1, 27).abs(), torch.tensor([*range(1, 28), 26])  # reflected at the edges

    def views(x):
        return [x, x.flip(-1)] if flip else [x]

    def mean_logits(x):
        return sum(model.net(v) for v in views(x)) / len(views(x))

    shifted = [images[:, :, back][..., back], images[:, :, ahead][..., ahead]]
    expected = mean_logits(images) / 2 + (mean_logits(shifted[0]) + mean_logits(shifted[1])) / 4
    with torch.no_grad():
        torch.testing.assert_close(model.evaluation_logits(images), expected.detach())
