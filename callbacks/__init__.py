"""The callbacks users list in YAML. A run holds a few owners, each one concern (callbacks/owner.py): the report
(callbacks.Report: the record, the epoch line with throughput, MFU and the step-time breakdown, memory, time to
accuracy, the test's pictures, predictions), the process-wide settings (callbacks.ProcessSettings), the progress bar
and the checkpoints; the run-safety owner is the harness's (fashion_mnist_dp.runtime.RunSafety). Tools a recipe adds:
stop at target, an average of the weights for evaluation (WeightEMA), gradient noise (GradientNoise). The arithmetic
lives in plain classes and functions the callbacks call."""

from callbacks.large_batch import GradientNoise
from callbacks.memory import PeakMemory
from callbacks.pictures import TestPictures
from callbacks.predictions import PredictionCSV
from callbacks.process import ProcessSettings
from callbacks.report import Report
from callbacks.stop_at_target import StopAtTarget
from callbacks.throughput import ThroughputReport
from callbacks.time_to_accuracy import TimeToAccuracy
from callbacks.weight_ema import WeightEMA

__all__ = ["GradientNoise", "PeakMemory", "PredictionCSV", "ProcessSettings", "Report",
           "StopAtTarget", "ThroughputReport", "TestPictures", "TimeToAccuracy", "WeightEMA"]
