"""The LightningModule, the plain networks it wraps, the learning-rate policy and the batch plan."""

from lightning_modules.classifier import FashionMNISTClassifier
from lightning_modules.lr_policy import LRPolicy

__all__ = ["FashionMNISTClassifier", "LRPolicy"]
