"""The LightningModule, the plain networks it wraps, and the learning-rate policy with the batch plan it scales by."""

from lightning_modules.classifier import FashionMNISTClassifier
from lightning_modules.lr_policy import LRPolicy

__all__ = ["FashionMNISTClassifier", "LRPolicy"]
