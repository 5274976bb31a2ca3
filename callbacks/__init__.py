"""The callbacks users list in YAML: throughput (the epoch line), memory, time to accuracy, predictions, stop at
target, an average of the weights for evaluation (WeightEMA). The arithmetic lives in plain classes the callbacks
call. The always-on guards live in runtime/."""

from callbacks.memory import PeakMemory
from callbacks.pictures import TestPictures
from callbacks.predictions import PredictionCSV
from callbacks.stop_at_target import StopAtTarget
from callbacks.throughput import ThroughputReport
from callbacks.time_to_accuracy import TimeToAccuracy
from callbacks.weight_ema import WeightEMA

__all__ = ["PeakMemory", "PredictionCSV", "StopAtTarget", "ThroughputReport", "TestPictures", "TimeToAccuracy",
           "WeightEMA"]
