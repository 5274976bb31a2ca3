"""On a GPU: does the step-time breakdown add host-device synchronisation, and does its split agree with Holistic
Trace Analysis (HTA)? train.py (ddp on one device) runs with the breakdown on, then off, each with a ProfiledWindow
(the torch profiler over a window of steps, forward, backward and optimizer marked as record_function ranges where
the breakdown takes its marks); prints the window's synchronising CUDA calls and the breakdown's parts beside HTA's.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.gpu_trace [--precision bf16-mixed]
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from lightning.pytorch import Callback

from benchmarks import launch
from benchmarks.speed import machine

SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")
RANGES = ("forward", "backward", "optimizer")
NETWORK, BATCH, START, STEPS = "wrn", 128, 70, 20
TRAIN_SUBSET = 8192  # 64 steps an epoch: the window in epoch 2
LR = 0.01  # wrn diverged by step 15 at the then default 0.05 (docs/lab/gpu.md)


class ProfiledWindow(Callback):
    """The torch profiler over optimizer steps [start, start + steps); writes trace/rank0.json and window.json (the
    synchronising calls) to ``folder``."""

    def __init__(self, folder: str, start: int = START, steps: int = STEPS) -> None:
        self.folder, self.start, self.steps = Path(folder), start, steps
        self.profiler = None
        self.open = []

    def _enter(self, name: str) -> None:
        if self.profiler is not None:
            self.open.append(torch.profiler.record_function(name))
            self.open[-1].__enter__()

    def _exit(self) -> None:
        while self.open:
            self.open.pop().__exit__(None, None, None)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.start and self.profiler is None:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                               torch.profiler.ProfilerActivity.CUDA])
            self.profiler.__enter__()
        self._enter("forward")

    def on_before_backward(self, trainer, pl_module, loss):
        self._exit()
        self._enter("backward")

    def on_after_backward(self, trainer, pl_module):
        self._exit()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._enter("optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._exit()
        if self.profiler is None or trainer.global_step != self.start + self.steps:
            return
        self.profiler.__exit__(None, None, None)
        calls = {e.key: e.count for e in self.profiler.key_averages() if e.key in SYNC_CALLS}
        (self.folder / "trace").mkdir()  # the trace alone in its folder: HTA reads every .json there
        self.profiler.export_chrome_trace(str(self.folder / "trace" / "rank0.json"))
        (self.folder / "window.json").write_text(json.dumps({"sync_calls": calls, "steps": self.steps}))
        self.profiler = None


def annotation_ms(folder: Path) -> tuple:
    """Mean GPU milliseconds per range over the window, from HTA; else (not installed, or it failed on the trace) from
    the trace's gpu_user_annotation spans, and why."""
    try:
        from hta.trace_analysis import TraceAnalysis

        analysis = TraceAnalysis(trace_dir=str(folder / "trace"))
        table = analysis.get_gpu_user_annotation_breakdown(visualize=False, num_kernels=100)
        rows = table.iterrows() if table is not None else ()  # None: no GPU annotation in the trace
        return {row["name"]: row["mean (us)"] / 1000 for _, row in rows if row["name"] in RANGES}, "HTA"
    except Exception as error:  # noqa: BLE001 - the trace's own spans still answer
        events = json.loads((folder / "trace" / "rank0.json").read_text())["traceEvents"]
        spans = {name: [e["dur"] / 1000 for e in events if e.get("cat") == "gpu_user_annotation" and e["name"] == name]
                 for name in RANGES}
        why = "not installed" if isinstance(error, ImportError) else f"failed: {type(error).__name__}: {error}"
        return {name: statistics.mean(v) for name, v in spans.items() if v}, f"trace spans; HTA {why}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--accelerator", default="gpu")  # cpu: to check the tool itself, no GPU figures
    args = parser.parse_args(argv)
    print(machine())
    for breakdown in (True, False):
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            profiled = ["--trainer.callbacks+=benchmarks.gpu_trace.ProfiledWindow", "--trainer.callbacks.folder",
                        str(folder)]  # the last of the run's callbacks
            latest = launch.train_record(["--breakdown", str(breakdown).lower(), *profiled, "--strategy", "ddp",
                                          "--devices", "1", "--accelerator", args.accelerator,
                                          "--network", NETWORK, "--trainer.precision", args.precision,
                                          "--lr", str(LR), "--batch_size", str(BATCH),
                                          "--data.train_subset", str(TRAIN_SUBSET), "--epochs", "2",
                                          "--trainer.limit_val_batches", "1", "--test_after_fit", "false"]).latest
            window = json.loads((folder / "window.json").read_text())
            print(f"breakdown {'on' if breakdown else 'off'}: {window['steps']} steps profiled, synchronising calls "
                  f"{window['sync_calls'] or 'none'}")
            if breakdown:
                steps = TRAIN_SUBSET // BATCH
                ours = {part: latest[f"time/{part}/rank0"] / steps * 1000 for part in RANGES}
                theirs, source = annotation_ms(folder)
                print(f"{NETWORK}, {args.precision}, ms per step: " + ", ".join(
                    f"{part} {ours[part]:.2f} (breakdown, epoch 2) vs {theirs.get(part, float('nan')):.2f}"
                    for part in RANGES) + f" ({source}, steps {START}..{START + STEPS - 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
