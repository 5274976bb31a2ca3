"""The callbacks users list in YAML: throughput (the epoch line), memory, time to accuracy, predictions, stop at
target, test pictures, an average of the weights for evaluation (WeightEMA), the large-batch tools that act on the
network (GhostBatchNorm, GradientNoise), Lightning's per-step dispatch without its no-op calls (LeanDispatch), and
Python's full garbage collections kept out of the training steps (GcFreeze), freed memory kept for the next step
(HeapReuse).
The arithmetic lives in plain classes and functions the callbacks call; the run's record (metrics.csv) is
run_record.py; the run-safety callbacks live in fashion_mnist_dp/runtime/ (all of them listed in
configs/default.yaml)."""

from callbacks.gc_freeze import GcFreeze
from callbacks.heap_reuse import HeapReuse
from callbacks.large_batch import GhostBatchNorm, GradientNoise
from callbacks.lean_dispatch import LeanDispatch
from callbacks.memory import PeakMemory
from callbacks.pictures import TestPictures
from callbacks.predictions import PredictionCSV
from callbacks.stop_at_target import StopAtTarget
from callbacks.throughput import ThroughputReport
from callbacks.time_to_accuracy import TimeToAccuracy
from callbacks.weight_ema import WeightEMA

__all__ = ["GcFreeze", "GhostBatchNorm", "GradientNoise", "HeapReuse", "LeanDispatch", "PeakMemory", "PredictionCSV",
           "StopAtTarget", "ThroughputReport", "TestPictures", "TimeToAccuracy", "WeightEMA"]
