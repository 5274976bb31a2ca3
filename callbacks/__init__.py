"""Reporting callbacks: one concern per file, the arithmetic in plain classes the callbacks call."""

from callbacks.memory import PeakMemory
from callbacks.predictions import PredictionCSV
from callbacks.stop_at_target import StopAtTarget
from callbacks.throughput import ThroughputReport
from callbacks.time_to_accuracy import TimeToAccuracy

__all__ = ["PeakMemory", "PredictionCSV", "StopAtTarget", "ThroughputReport", "TimeToAccuracy"]
