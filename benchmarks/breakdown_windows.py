"""What the step-time breakdown costs, in one process: alternating windows of steps with it on (sampled, as it runs
on a GPU) and paused, the median step time of each kind, their ratio. Pairs of whole runs are too noisy for 2 %.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.breakdown_windows --accelerator gpu [--precision bf16-mixed]

train.py (``cnn``, batch 128) runs with ``--breakdown true`` and :class:`AlternatingWindows`: from epoch 2 it times
windows of 200 steps (device synchronised at their ends), the breakdown's timer paused (``StepTimer.paused``) in every
other one, until 20 of each kind are in. A paused window still pays the DDP comm hook's Python (docs/lab/gpu.md).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from lightning.pytorch import Callback

from benchmarks import launch

NETWORK, BATCH, WINDOW, WINDOWS = "cnn", 128, 200, 20


class AlternatingWindows(Callback):
    """Times ``windows`` × 2 windows of ``window`` steps, the breakdown on in even ones and paused in odd ones;
    writes {"on": [s/step...], "off": [...]} to ``$BREAKDOWN_WINDOWS_OUT`` and stops the run."""

    def __init__(self, window: int = WINDOW, windows: int = WINDOWS) -> None:
        self.window, self.windows = window, windows
        self.times: Dict[str, List[float]] = {"on": [], "off": []}
        self._started = None
        self._steps = 0

    def _report(self, trainer):
        from callbacks.owner import find
        from callbacks.throughput import ThroughputReport

        return find(trainer.callbacks, ThroughputReport)

    def _sync(self, trainer) -> None:
        import torch

        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.current_epoch < 1:
            return
        if self._started is None or self._steps == self.window:
            self._sync(trainer)
            now = time.perf_counter()
            if self._started is not None:
                kind = "on" if len(self.times["on"]) == len(self.times["off"]) else "off"
                self.times[kind].append((now - self._started) / self.window)
            timer = self._report(trainer).timer
            if timer is None:
                raise RuntimeError("the breakdown is off: run with --breakdown true")
            timer.paused = len(self.times["on"]) > len(self.times["off"])  # the next window is "off"
            self._started, self._steps = now, 0
            if min(len(v) for v in self.times.values()) >= self.windows:
                Path(os.environ["BREAKDOWN_WINDOWS_OUT"]).write_text(json.dumps(self.times))
                trainer.should_stop = True
        self._steps += 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.breakdown_windows",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--timeout", type=float, default=480)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="breakdown-windows-") as folder:
        out = Path(folder) / "windows.json"
        env = launch.clean_env({"BREAKDOWN_WINDOWS_OUT": str(out)}, keep_data_dir=True)
        epochs = 2 + (2 * WINDOW * WINDOWS) // (60000 // BATCH)
        finished = launch.run_train(
            ["--strategy", "ddp", "--devices", "1", "--accelerator", args.accelerator, "--precision", args.precision,
             "--network", NETWORK, "--batch_size", str(BATCH), "--breakdown", "true", "--epochs", str(epochs),
             "--trainer.limit_val_batches", "1", "--test_after_fit", "false",
             "--trainer.callbacks+=benchmarks.breakdown_windows.AlternatingWindows"], Path(folder), args.timeout, env)
        if not out.exists():
            raise SystemExit(f"train.py exited {finished.returncode} before its windows:\n{finished.stderr[-3000:]}")
        times = json.loads(out.read_text())
    from benchmarks.speed import machine

    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"{NETWORK}, batch {BATCH}, {args.precision}, ddp on 1 {args.accelerator} device; "
          f"{len(times['on'])} + {len(times['off'])} alternating windows of {WINDOW} steps; {machine()}")
    print(f"step time: breakdown on {on * 1e3:.3f} ms, paused {off * 1e3:.3f} ms; speed with it / without "
          f"{off / on:.3f} (on by default on GPUs from 0.98)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
