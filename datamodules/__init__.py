"""Fashion-MNIST data: files, splits, distributed sampling, fast batches."""

from datamodules.fashion_mnist import FashionMNISTDataModule

__all__ = ["FashionMNISTDataModule"]
