"""Reporting and guarding callbacks: one concern per file, the arithmetic in plain classes the callbacks call."""

from callbacks.divergence import DivergenceGuard, TrainingDiverged
from callbacks.memory import PeakMemory
from callbacks.predictions import PredictionCSV
from callbacks.throughput import ThroughputReport

__all__ = ["DivergenceGuard", "PeakMemory", "PredictionCSV", "ThroughputReport", "TrainingDiverged"]
