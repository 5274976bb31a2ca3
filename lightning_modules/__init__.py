"""The LightningModule, the plain networks it wraps, and the optimizer / learning-rate rules."""

from lightning_modules.classifier import FashionMNISTClassifier

__all__ = ["FashionMNISTClassifier"]
