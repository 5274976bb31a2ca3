"""Fashion-MNIST data: files, splits, distributed sampling, fast batches."""

from datamodules.fashion_mnist import CorruptDataError, DataNotFoundError, FashionMNISTDataModule

__all__ = ["CorruptDataError", "DataNotFoundError", "FashionMNISTDataModule"]
