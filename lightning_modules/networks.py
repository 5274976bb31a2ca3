"""The shipped networks for 1×28×28 images, each a plain ``nn.Module`` class that a config names by class path
(``model.network: {class_path: lightning_modules.networks.FastCNN}``); any other ``nn.Module`` works the same way.
The short names of ``--network`` are fashion_mnist_dp/cli/shorthand.py's table."""

from typing import Sequence, Tuple

import torch
from jsonargparse.typing import PositiveInt
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

# Modules whose weights are scales, not features: no weight decay on them (optim.py).
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def _cbr(c_in: int, c_out: int) -> nn.Sequential:
    """The workshop's ``cbrblock``: conv 3×3 (no bias) → batch-norm → ReLU."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


def _double_cbr_pool(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(*_cbr(c_in, c_out), *_cbr(c_out, c_out), nn.MaxPool2d(2))


class SmallCNN(nn.Sequential):
    """``cnn``, the default: two conv-BN-ReLU stages and a small head, ~0.4 M parameters, ~91-92 % in 3 epochs."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.25) -> None:
        super().__init__(
            _double_cbr_pool(1, 32),  # 28 -> 14
            _double_cbr_pool(32, 64),  # 14 -> 7
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(64 * 7 * 7, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )


class FastCNN(nn.Sequential):
    """``fast_cnn``: one conv-pool-BN-ReLU per stage (16, 64) and a 128-unit head, an eighth of cnn's multiply-adds;
    pooling before batch-norm and ReLU, which were the CPU's cost at 28×28 (docs/benchmarks.md)."""

    def __init__(self, num_classes: int = 10) -> None:
        def stage(c_in: int, c_out: int) -> nn.Sequential:
            conv, norm, relu = _cbr(c_in, c_out)
            return nn.Sequential(conv, nn.MaxPool2d(2), norm, relu)

        super().__init__(
            stage(1, 16),  # 28 -> 14
            stage(16, 64),  # 14 -> 7
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )


class StagedCNN(nn.Sequential):
    """``staged_cnn``, the CPU record's network (configs/recipes/record_cpu.yaml): VGG's stages (3×3 conv-BN-ReLU
    layers, the map halved by a 2×2 max-pool after each stage) with FastCNN's order in each stage's last layer (conv,
    pool, then batch-norm and ReLU on a quarter of the pixels), global max pooling and one linear layer. ``stages``:
    (width, convolutions) per stage. Of those tried on held-out images, four narrow stages down to 1×1, one
    convolution at full size, were the fastest to 94 %: depth is cheap where the map is small (docs/benchmarks.md,
    "The 94 % CPU record")."""

    def __init__(self, num_classes: int = 10, stages: Sequence[Tuple[PositiveInt, PositiveInt]] = (
            (16, 1), (32, 2), (64, 2), (128, 2))) -> None:
        layers, c_in = [], 1
        for width, convs in stages:
            for _ in range(convs - 1):
                layers.append(_cbr(c_in, width))
                c_in = width
            conv, norm, relu = _cbr(c_in, width)
            layers.append(nn.Sequential(conv, nn.MaxPool2d(2), norm, relu))
            c_in = width
        super().__init__(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes))


class GpuCNN(nn.Sequential):
    """``gpu_cnn``: three stages of two conv-BN-ReLU (64, 128, 256) and global pooling: six times cnn's work, which a
    GPU step bound by launch overhead barely notices (docs/benchmarks.md). Slow on CPU: use FastCNN there."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(
            _double_cbr_pool(1, 64),  # 28 -> 14
            _double_cbr_pool(64, 128),  # 14 -> 7
            _double_cbr_pool(128, 256),  # 7 -> 3
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
            nn.Linear(256, num_classes),
        )


class MLP(nn.Sequential):
    """``mlp``: a 784-hidden-10 perceptron with no batch-norm and no dropout, so a batch's update does not depend on
    how it is split over devices (the ddp-equivalence tests); ~85 % in 1 epoch."""

    def __init__(self, num_classes: int = 10, hidden: int = 256) -> None:
        super().__init__(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(inplace=True),
                         nn.Linear(hidden, num_classes))


class _WideBlock(nn.Module):
    """The workshop's ``conv_block``: cbr → dropout → cbr, plus a 1×1 projection when widths differ."""

    def __init__(self, c_in: int, c_out: int, dropout: float) -> None:
        super().__init__()
        self.body = nn.Sequential(_cbr(c_in, c_out), nn.Dropout(dropout), _cbr(c_out, c_out))
        self.shortcut = nn.Conv2d(c_in, c_out, 1, bias=False) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


class WideResNet(nn.Sequential):
    """``wrn``: the DLI course's WideResNet, channels 16/160/320/640, two blocks per stage (~17 M parameters)."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.01) -> None:
        super().__init__(
            _cbr(1, 16),
            _WideBlock(16, 160, dropout), _WideBlock(160, 160, dropout),
            nn.MaxPool2d(2),  # 28 -> 14
            _WideBlock(160, 320, dropout), _WideBlock(320, 320, dropout),
            nn.MaxPool2d(2),  # 14 -> 7
            _WideBlock(320, 640, dropout), _WideBlock(640, 640, dropout),
            nn.AvgPool2d(7),
            nn.Flatten(),
            nn.Linear(640, num_classes),
        )


class ResNet18(ResNet):
    """``resnet18``: torchvision's ResNet-18 with a 3×3 stride-1 stem and no max-pool, for 1×28×28 input."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(BasicBlock, [2, 2, 2, 2], num_classes=num_classes)
        self.conv1 = nn.Conv2d(1, 64, 3, stride=1, padding=1, bias=False)
        self.maxpool = nn.Identity()
