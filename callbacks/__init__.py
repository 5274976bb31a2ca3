"""Reporting and guarding callbacks: one concern per file, the arithmetic in plain classes the callbacks call."""

from callbacks.divergence import DivergenceGuard, TrainingDiverged
from callbacks.memory import PeakMemory
from callbacks.predictions import PredictionCSV
from callbacks.stop_at_target import StopAtTarget
from callbacks.throughput import ThroughputReport
from callbacks.time_to_accuracy import TimeToAccuracy

__all__ = [
    "DivergenceGuard",
    "PeakMemory",
    "PredictionCSV",
    "StopAtTarget",
    "ThroughputReport",
    "TimeToAccuracy",
    "TrainingDiverged",
]
