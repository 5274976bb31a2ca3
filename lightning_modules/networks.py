"""Plain ``nn.Module`` networks for 1×28×28 images: ``cnn`` (the default, a laptop CPU in minutes), ``fast_cnn`` (CPU
time-to-accuracy), ``gpu_cnn`` (width a GPU has to spare), ``mlp`` (no batch-norm or dropout: a batch's update does not
depend on its split across devices), ``wrn`` (the DLI workshop's WideResNet), ``resnet18`` (torchvision's, 28×28 stem)."""

from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10
# Modules whose weights are scales, not features: no weight decay (optim.py), frozen by freeze_norm_scales.
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def _cbr(c_in: int, c_out: int) -> nn.Sequential:
    """The workshop's ``cbrblock``: conv 3×3 (no bias) → batch-norm → ReLU."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


def small_cnn(num_classes: int = NUM_CLASSES) -> nn.Module:
    """Two conv-BN-ReLU stages and a small head: ~0.4 M parameters, ~91-92 % in 3 epochs."""

    def stage(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(*_cbr(c_in, c_out), *_cbr(c_out, c_out), nn.MaxPool2d(2))

    return nn.Sequential(
        stage(1, 32),  # 28 -> 14
        stage(32, 64),  # 14 -> 7
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(inplace=True),
        nn.Linear(128, num_classes),
    )


def fast_cnn(num_classes: int = NUM_CLASSES) -> nn.Module:
    """One conv-pool-BN-ReLU per stage (16, 64) and a 128-unit head: an eighth of cnn's multiply-adds; pooling before
    batch-norm and ReLU, which were the CPU's cost at 28×28 (docs/benchmarks.md)."""

    def stage(c_in: int, c_out: int) -> nn.Sequential:
        conv, norm, relu = _cbr(c_in, c_out)
        return nn.Sequential(conv, nn.MaxPool2d(2), norm, relu)

    return nn.Sequential(
        stage(1, 16),  # 28 -> 14
        stage(16, 64),  # 14 -> 7
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(inplace=True),
        nn.Linear(128, num_classes),
    )


def gpu_cnn(num_classes: int = NUM_CLASSES) -> nn.Module:
    """Three stages of two conv-BN-ReLU (64, 128, 256) and global pooling: six times cnn's work, which a GPU step
    bound by launch overhead barely notices (docs/benchmarks.md). Slow on CPU: use fast_cnn."""

    def stage(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(*_cbr(c_in, c_out), *_cbr(c_out, c_out), nn.MaxPool2d(2))

    return nn.Sequential(
        stage(1, 64),  # 28 -> 14
        stage(64, 128),  # 14 -> 7
        stage(128, 256),  # 7 -> 3
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(256, num_classes),
    )


def mlp(num_classes: int = NUM_CLASSES) -> nn.Module:
    """784-256-10 perceptron: no batch-norm, no dropout (~0.2 M parameters, ~85 % in 1 epoch)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 256), nn.ReLU(inplace=True), nn.Linear(256, num_classes))


class _WideBlock(nn.Module):
    """The workshop's ``conv_block``: cbr → dropout → cbr, plus a 1×1 projection when widths differ."""

    def __init__(self, c_in: int, c_out: int, dropout: float = 0.01) -> None:
        super().__init__()
        self.body = nn.Sequential(_cbr(c_in, c_out), nn.Dropout(dropout), _cbr(c_out, c_out))
        self.shortcut = nn.Conv2d(c_in, c_out, 1, bias=False) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


def wide_resnet(num_classes: int = NUM_CLASSES) -> nn.Module:
    """The DLI course's WideResNet: channels 16/160/320/640, two blocks per stage (~17 M parameters)."""
    return nn.Sequential(
        _cbr(1, 16),
        _WideBlock(16, 160),
        _WideBlock(160, 160),
        nn.MaxPool2d(2),  # 28 -> 14
        _WideBlock(160, 320),
        _WideBlock(320, 320),
        nn.MaxPool2d(2),  # 14 -> 7
        _WideBlock(320, 640),
        _WideBlock(640, 640),
        nn.AvgPool2d(7),
        nn.Flatten(),
        nn.Linear(640, num_classes),
    )


def resnet18(num_classes: int = NUM_CLASSES) -> nn.Module:
    """torchvision ResNet-18 with a 3×3 stride-1 stem and no max-pool, for 1×28×28 input."""
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(1, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


NETWORKS: Dict[str, Callable[[int], nn.Module]] = {
    "cnn": small_cnn,
    "fast_cnn": fast_cnn,
    "gpu_cnn": gpu_cnn,
    "mlp": mlp,
    "wrn": wide_resnet,
    "resnet18": resnet18,
}


def build_network(name: str, num_classes: int = NUM_CLASSES) -> nn.Module:
    """Build a network by its config name (a key of ``NETWORKS``)."""
    try:
        factory = NETWORKS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; choose one of: {', '.join(NETWORKS)}") from None
    return factory(num_classes)


def init_convs_as_identity(net: nn.Module) -> int:
    """airbench's identity init: every 2-D convolution with at least as many outputs as inputs, odd kernel and
    'same' padding starts with its first ``in_channels`` filters passing their input channel through unchanged
    (``nn.init.dirac_``), so a deep stack starts near the identity. Returns how many convolutions it changed."""
    changed = 0
    for conv in net.modules():
        if (isinstance(conv, nn.Conv2d) and conv.groups == 1 and conv.out_channels >= conv.in_channels
                and all(k % 2 == 1 and p == k // 2 for k, p in zip(conv.kernel_size, conv.padding))):
            with torch.no_grad():
                nn.init.dirac_(conv.weight[:conv.in_channels])
            changed += 1
    return changed


def freeze_norm_scales(net: nn.Module) -> int:
    """airbench's fixed batch-norm scales: every norm layer's weight stays at its initial 1 and only its bias
    trains (one fewer degree of freedom per channel that the next layer's weights already have). Returns how many
    weights it froze."""
    frozen = 0
    for norm in net.modules():
        if isinstance(norm, NORM_LAYERS) and getattr(norm, "weight", None) is not None:
            norm.weight.requires_grad_(False)
            frozen += 1
    return frozen


def first_convolution(net: nn.Module) -> nn.Conv2d:
    """The network's first 2-D convolution in module order (the one that sees the pixels)."""
    for module in net.modules():
        if isinstance(module, nn.Conv2d):
            return module
    raise ValueError("the network has no convolution to initialise from the data")


def patch_whitening_filters(images: torch.Tensor, kernel_size: int, eps: float = 5e-4) -> torch.Tensor:
    """airbench's whitening filters for ``kernel_size``² patches of ``images`` (N×C×H×W, normalised as in training):
    the eigenvectors of the patches' second-moment matrix, largest eigenvalue first, each divided by
    sqrt(eigenvalue + eps), then the same filters negated (so a ReLU later keeps both signs). A patch convolved
    with the first C·k² filters has (near) identity covariance: each direction of pixel variation starts at unit
    scale, and the network does not have to learn that first. Returns (2·C·k²)×C×k×k."""
    channels = images.shape[1]
    patches = F.unfold(images.double(), kernel_size).transpose(1, 2).reshape(-1, channels * kernel_size ** 2)
    moment = patches.T @ patches / len(patches)
    eigenvalues, eigenvectors = torch.linalg.eigh(moment)  # ascending
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    filters = (eigenvectors / torch.sqrt(eigenvalues + eps)).T.reshape(-1, channels, kernel_size, kernel_size)
    return torch.cat((filters, -filters)).float()


def init_first_conv_as_whitening(net: nn.Module, images: torch.Tensor, eps: float = 5e-4) -> int:
    """Start the first convolution's filters as patch whitening of ``images`` (patch_whitening_filters): the first
    half of its filters (up to C·k²) are the scaled eigenvectors, as many after them their negatives, the rest stay
    as drawn. Needs a square kernel. Returns how many eigenvectors it used."""
    conv = first_convolution(net)
    k = conv.kernel_size[0]
    if conv.kernel_size[1] != k or conv.groups != 1 or conv.in_channels != images.shape[1]:
        raise ValueError(f"the first convolution ({conv}) cannot take patch whitening of "
                         f"{images.shape[1]}-channel images")
    filters = patch_whitening_filters(images, k, eps)
    used = min(conv.out_channels // 2, len(filters) // 2)
    with torch.no_grad():
        conv.weight[:used] = filters[:used]
        conv.weight[used:2 * used] = -filters[:used]
    return used
