"""Tiny Fashion-MNIST stand-ins in torchvision's IDX layout, so tests never need the network or ../shared.

Every image carries its own index in its first two pixels (low byte, high byte),
so a test can tell exactly which samples a rank trained or validated on. The rest
of the image is a class-dependent pattern plus noise: learnable, but not trivially.
"""

import struct
from pathlib import Path

import numpy as np

IMAGE_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
LABEL_MAGIC = 0x00000801  # unsigned byte, 1 dimension
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530


def write_idx(path: Path, array: np.ndarray) -> None:
    magic = IMAGE_MAGIC if array.ndim == 3 else LABEL_MAGIC
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def make_split(n: int, seed: int):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 60, size=(n, 28, 28))
    for cls in range(10):
        rows = labels == cls
        images[rows, 2 + 2 * cls : 4 + 2 * cls, 4:24] += 180  # a bright bar whose height gives the class
    index = np.arange(n)
    images[:, 0, 0] = index % 256
    images[:, 0, 1] = index // 256
    return images.clip(0, 255), labels


def write_fashion_mnist(root: Path, n_train: int = 256, n_test: int = 101) -> Path:
    """Write the four IDX files under ``root/FashionMNIST/raw``; returns ``root``."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = make_split(n, seed)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


def sample_ids(normalised_images) -> list:
    """Recover each image's index from a normalised N×1×28×28 batch."""
    pixels = (normalised_images[:, 0, 0, :2].double() * PIXEL_STD + PIXEL_MEAN) * 255
    pixels = pixels.round().long()
    return (pixels[:, 0] + 256 * pixels[:, 1]).tolist()
