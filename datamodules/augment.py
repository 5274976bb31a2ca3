"""Random crop and horizontal flip of a whole uint8 batch on its device: a pad, a gather and a ``where`` instead
of 2×N PIL operations. Draws come from a generator seeded by (seed, rank, epoch, batch), so a resumed run draws the
same and ranks draw independently."""

import hashlib
import os

import torch
import torch.nn.functional as F


def run_seed() -> int:
    """The run's seed, as Lightning's ``seed_everything`` set it for every rank (``PL_GLOBAL_SEED``; 0 when none was
    set): the one place it is read, by everything that draws per (seed, rank, epoch, step): the sampler,
    augmentation, gradient noise."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def augmentation_seed(seed: int, rank: int, epoch: int, batch: int) -> int:
    """A 32-bit seed for one batch's draws (torch's CPU generator keeps only the low 32 bits)."""
    digest = hashlib.blake2b(f"augment:{seed}:{rank}:{epoch}:{batch}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Each image shifted by its own offset in [-padding, padding] on both axes; uncovered pixels are 0: torchvision's
    ``RandomCrop(size, padding)`` per image, done for the batch as one zero pad and one gather of an H×W window each."""
    if padding <= 0:
        return images
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    top = torch.randint(0, 2 * padding + 1, (n,), device=images.device, generator=generator)
    left = torch.randint(0, 2 * padding + 1, (n,), device=images.device, generator=generator)
    rows = (top[:, None] + torch.arange(h, device=images.device))[:, None, :, None]  # n×1×h×1
    cols = (left[:, None] + torch.arange(w, device=images.device))[:, None, None, :]  # n×1×1×w
    batch = torch.arange(n, device=images.device)[:, None, None, None]
    channel = torch.arange(c, device=images.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]


def random_horizontal_flip(images: torch.Tensor, generator: torch.Generator, p: float = 0.5) -> torch.Tensor:
    """Each image mirrored left-right with probability ``p``."""
    flip = torch.rand(images.shape[0], device=images.device, generator=generator) < p
    return torch.where(flip[:, None, None, None], images.flip(-1), images)
