"""Trials of the CPU record that lost on held-out images (docs/benchmarks.md, "The 94 % CPU record"): kept in the
commit their figures name, removed after.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.record_trials CHECKPOINT

evaluates a staged_cnn checkpoint trained with ``--data.val_size 5000`` on those held-out images with one-pixel
shifts added to the flip test-time augmentation (bf16 autocast, as the recipe)."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from datamodules.fashion_mnist import FashionMNISTDataModule, normalise
from lightning_modules.networks import StagedCNN


class StagedWholeMapPool(StagedCNN):
    """staged_cnn whose last stage max-pools its whole 3x3 map (before batch-norm, as the other stages' pools) instead
    of a 2x2 max-pool, which reads only the map's first two rows and columns; ``ceil``: the other pools keep an odd
    map's last row and column too (7x7 to 4x4, so the last stage runs at 4x4)."""

    def __init__(self, num_classes: int = 10, stages=((16, 1), (32, 2), (64, 2), (128, 2)), ceil: bool = False):
        super().__init__(num_classes, stages)
        pools = [(parent, name) for parent in self.modules() for name, child in parent.named_children()
                 if isinstance(child, nn.MaxPool2d)]
        parent, name = pools[-1]
        setattr(parent, name, nn.AdaptiveMaxPool2d(1))
        if ceil:
            for parent, name in pools[:-1]:
                setattr(parent, name, nn.MaxPool2d(2, ceil_mode=True))


class StagedHeadTrial(StagedCNN):
    """staged_cnn with its output layer at zero (``zero_head``: every class equal at the start), or dropout before it."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.0, zero_head: bool = True):
        super().__init__(num_classes)
        head = self[-1]
        if zero_head:
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
        if dropout:
            self[-1] = nn.Sequential(nn.Dropout(dropout), head)


SHIFTS = {  # (dx, dy) views, each also mirrored
    "flip (the recipe's)": [(0, 0)],
    "flip + x ±1": [(0, 0), (1, 0), (-1, 0)],
    "flip + y ±1": [(0, 0), (0, 1), (0, -1)],
    "flip + x ±1, y ±1": [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)],
    "flip + 4 diagonals": [(0, 0), (1, 1), (-1, -1), (1, -1), (-1, 1)],
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    opts = parser.parse_args(argv)
    data = FashionMNISTDataModule(val_size=5000, download=False)
    data.prepare_data()
    data.setup("fit")
    padded, targets = F.pad(data.val_set.images, (1, 1, 1, 1)), data.val_set.targets  # uint8, background 0
    network = StagedCNN()
    state = torch.load(opts.checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    network.load_state_dict({key[4:]: value for key, value in state.items() if key.startswith("net.")})
    network.eval().to(memory_format=torch.channels_last)

    def logits(dx: int, dy: int, flip: bool) -> torch.Tensor:
        images = normalise(padded[..., 1 + dy:29 + dy, 1 + dx:29 + dx])
        images = images.flip(-1) if flip else images
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.cat([network(batch.contiguous(memory_format=torch.channels_last)).float()
                              for batch in images.split(1000)])

    for name, views in SHIFTS.items():
        total = sum(logits(dx, dy, flip) for dx, dy in views for flip in (False, True))
        print(f"{name}: {(total.argmax(1) == targets).float().mean().item():.2%}")


if __name__ == "__main__":
    main()
