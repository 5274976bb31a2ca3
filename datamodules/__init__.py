"""Fashion-MNIST data: files, splits, distributed sampling, fast batches."""

from datamodules.fashion_mnist import DataNotFoundError, FashionMNISTDataModule
from datamodules.idx_check import CorruptDataError

__all__ = ["CorruptDataError", "DataNotFoundError", "FashionMNISTDataModule"]
