"""airbench's model options: identity (Dirac) init of the convolutions and frozen batch-norm scales."""

import torch

from lightning_modules import FashionMNISTClassifier
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
