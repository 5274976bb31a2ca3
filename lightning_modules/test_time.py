"""Test-time augmentation (airbench's): evaluation averages the logits of several views of each image. Evaluation
only; training never sees it."""

from typing import Callable

import torch
import torch.nn.functional as F

Forward = Callable[[torch.Tensor], torch.Tensor]


def augmented_logits(forward: Forward, images: torch.Tensor, flip: bool, translate: bool) -> torch.Tensor:
    """``flip``: the mean over the image and its mirror image. ``translate`` too: half that and half the same for
    the image shifted one pixel up-left and one down-right (reflected edges), airbench's weighting."""
    logits = _flip_averaged(forward, images, flip)
    if translate:
        padded = F.pad(images, (1, 1, 1, 1), mode="reflect")
        height, width = images.shape[-2:]
        shifted = [padded[..., :height, :width], padded[..., 2:, 2:]]
        logits = (logits + sum(_flip_averaged(forward, view, flip) for view in shifted) / 2) / 2
    return logits


def _flip_averaged(forward: Forward, images: torch.Tensor, flip: bool) -> torch.Tensor:
    logits = forward(images)
    if flip:
        logits = (logits + forward(images.flip(-1))) / 2
    return logits
