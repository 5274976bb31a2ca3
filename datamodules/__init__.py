"""Fashion-MNIST data: files, splits, distributed sampling, fast batches."""

from datamodules.fashion_mnist import DataNotFoundError, FashionMNISTDataModule

__all__ = ["DataNotFoundError", "FashionMNISTDataModule"]
