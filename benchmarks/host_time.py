"""Host time per training step (`make bench`): train.py against Lightning's own dispatch, with a near-zero network.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.host_time [--repeats 5] [--profile]
    ... --accelerator gpu --network cnn --batch_size 512 --precision bf16-mixed   # the same rows on a GPU (P1)

With ``lightning_modules.networks.MLP`` of 8 hidden units (6.4 K parameters), batch 128, one thread, what is left of
a step is host work: the regime of a small model's GPU step, whose time is bound by the Python around it. Four rows,
each in its own process, run in interleaved order (a, b, c, d, then d, c, b, a, ...), medians of the repeats:

  bare:       a PyTorch loop (forward, loss, backward, SGD step) over batches already in memory;
  lightning:  the same in a minimal LightningModule under a plain ``Trainer`` (no logger, checkpoint, bar, summary);
  reference:  the same + as many no-op callbacks as a default run holds (9) + a ``CSVLogger``: what train.py's
              own per-step work costs beyond Lightning's, each callback's hooks dispatched by Lightning in both;
  train.py:   ``python train.py --network mlp --model.network.init_args.hidden 8`` (configs/default.yaml, every
              callback on), on the Fashion-MNIST files of ``$FASHION_MNIST_DIR``.

Each row times optimizer steps [skip, skip + steps) of its second epoch (no start-up, validation or epoch end inside
the window; fewer than 400 steps when an epoch is shorter) with :class:`StepWindow`, the same callback in the three
Lightning rows; on a GPU the device is synchronised at the window's two ends. ``--profile`` runs train.py once
under cProfile over the same window and sums the time per callback and per module (``attribute``).
"""

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks import launch
from benchmarks.tables import markdown_table, median_range

HIDDEN, SKIP, STEPS, EPOCH, TRAIN_IMAGES = 8, 20, 400, 1, 60000
# a default run's trainer.callbacks at setup: default.yaml's 6 and the 3 the CLI and Lightning add
DEFAULT_CALLBACKS = 9
SUB_WINDOW = 50  # steps: each holds one decision point (check_every_n_steps) and one log step
ROWS = ("bare", "lightning", "reference", "train.py")
TARGET = 1.25  # train.py / reference: the bar this benchmark reports against (docs/lab/speed.md)
DEFAULT_SETTING = {"network": "mlp8", "batch_size": 128, "accelerator": "cpu", "precision": "32-true"}


def setting() -> dict:
    """What every row runs: the network (``mlp8``: MLP with 8 hidden units; else a ``--network`` short name), the
    batch, the accelerator and the precision; passed to each row's process in ``$HOST_TIME_SETTING``."""
    return {**DEFAULT_SETTING, **json.loads(os.environ.get("HOST_TIME_SETTING", "{}"))}


def window_steps(batch_size: int) -> int:
    """Steps timed: 400, or what an epoch holds after the skipped ones and before its last batch."""
    return min(STEPS, TRAIN_IMAGES // batch_size - SKIP - 1)


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and setting()["accelerator"] in ("gpu", "cuda"):
        torch.cuda.synchronize()


def _write(us_per_step: float, extra: Optional[dict] = None) -> None:
    Path(os.environ["HOST_TIME_OUT"]).write_text(json.dumps({"us_per_step": us_per_step, **(extra or {})}))


try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - the project installs lightning
    Callback = object


class StepWindow(Callback):
    """Times batches [skip, skip + steps) of epoch ``epoch`` between their ``on_train_batch_start`` hooks and writes
    µs/step to ``$HOST_TIME_OUT``; with ``$HOST_TIME_PROFILE`` set, profiles the same window into that file. A
    validation inside the window (train.py validates twice an epoch) is left out of its time."""

    def __init__(self, skip: int = SKIP, steps: Optional[int] = None, epoch: int = EPOCH) -> None:
        self.skip, self.epoch = skip, epoch
        self.steps = steps or window_steps(setting()["batch_size"])
        self._start: Optional[float] = None
        self._cpu_start = 0.0
        self._marks: List[float] = []
        self._profiler: Optional[cProfile.Profile] = None
        self._validation = (0.0, 0.0)  # when the validation under way started: wall clock, thread CPU time

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._start is not None:
            self._validation = (time.perf_counter(), time.thread_time())

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._start is not None:  # the window's marks move on by the validation's length
            wall, cpu = time.perf_counter() - self._validation[0], time.thread_time() - self._validation[1]
            self._start, self._cpu_start = self._start + wall, self._cpu_start + cpu
            self._marks = [mark + wall for mark in self._marks]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.current_epoch != self.epoch:
            return
        if self._start is not None and (batch_idx - self.skip) % SUB_WINDOW == 0:
            self._marks.append(time.perf_counter())
        if batch_idx == self.skip:
            if os.environ.get("HOST_TIME_PROFILE"):
                self._profiler = cProfile.Profile()
                self._profiler.enable()
            _sync()
            self._start, self._cpu_start = time.perf_counter(), time.thread_time()
        elif batch_idx == self.skip + self.steps and self._start is not None:
            _sync()
            elapsed, cpu = time.perf_counter() - self._start, time.thread_time() - self._cpu_start
            if self._profiler is not None:
                self._profiler.disable()
                self._profiler.dump_stats(os.environ["HOST_TIME_PROFILE"])
            subs = [(b - a) / SUB_WINDOW * 1e6 for a, b in zip([self._start] + self._marks, self._marks)]
            import torch
            _write(elapsed / self.steps * 1e6, {"cpu_us_per_step": cpu / self.steps * 1e6, "best_sub_window": min(subs),
                                                "threads": torch.get_num_threads()})
            self._start = None


def _batches(n: int, device: str = "cpu"):
    import torch

    generator, size = torch.Generator().manual_seed(0), setting()["batch_size"]
    return [(((torch.rand(size, 1, 28, 28, generator=generator) - 0.29) / 0.35).to(device),
             torch.randint(0, 10, (size,), generator=generator).to(device)) for _ in range(n)]


class Batches:
    """An iterable of ready batches (a list would be taken for several data loaders)."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _network():
    from lightning_modules.networks import MLP

    name = setting()["network"]
    if name == "mlp8":
        return MLP(hidden=HIDDEN)
    from benchmarks.speed import named_class

    return named_class("--model.network", name)()


def _sgd(parameters):
    import torch

    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9, weight_decay=5e-4)


def run_bare() -> None:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    chosen, steps = setting(), window_steps(setting()["batch_size"])
    device = "cuda" if chosen["accelerator"] in ("gpu", "cuda") else "cpu"
    model, batches = _network().to(device), _batches(SKIP + steps + 10, device)
    optimizer = _sgd(model.parameters())
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=chosen["precision"] == "bf16-mixed")
    for epoch in range(EPOCH + 1):
        for index, (images, targets) in enumerate(batches):
            if epoch == EPOCH and index in (SKIP, SKIP + steps):
                _sync()
                if index == SKIP:
                    start, cpu_start = time.perf_counter(), time.thread_time()
                else:
                    _write((time.perf_counter() - start) / steps * 1e6,
                           {"cpu_us_per_step": (time.thread_time() - cpu_start) / steps * 1e6})
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = F.cross_entropy(model(images), targets)
            loss.backward()
            optimizer.step()


def run_lightning(reference: bool) -> None:
    import torch
    import torch.nn.functional as F
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.loggers import CSVLogger

    class Minimal(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _network()

        def training_step(self, batch, batch_idx):
            images, targets = batch
            return F.cross_entropy(self.net(images), targets)

        def configure_optimizers(self):
            return _sgd(self.parameters())

    torch.manual_seed(0)
    chosen = setting()
    callbacks: List[Callback] = [StepWindow()] + ([Callback() for _ in range(DEFAULT_CALLBACKS)] if reference else [])
    with tempfile.TemporaryDirectory() as logs:
        trainer = Trainer(accelerator=chosen["accelerator"], devices=1, precision=chosen["precision"],
                          max_epochs=EPOCH + 1, callbacks=callbacks,
                          logger=CSVLogger(logs) if reference else False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        batches = _batches(SKIP + window_steps(chosen["batch_size"]) + 10)
        trainer.fit(Minimal(), train_dataloaders=Batches(batches))


def measure(row: str, chosen: dict, profile: Optional[Path] = None) -> Dict[str, float]:
    """One process of ``row`` in setting ``chosen``; its µs/step."""
    with tempfile.TemporaryDirectory(prefix="host-time-") as folder:
        out = Path(folder) / "window.json"
        env = launch.clean_env({"HOST_TIME_OUT": str(out), "HOST_TIME_SETTING": json.dumps(chosen),
                                **({"HOST_TIME_PROFILE": str(profile)} if profile else {})}, keep_data_dir=True)
        if row.startswith("train.py"):
            network = ["--network", "mlp", "--model.network.init_args.hidden", str(HIDDEN)] \
                if chosen["network"] == "mlp8" else ["--network", chosen["network"]]
            args = [*network, "--batch_size", str(chosen["batch_size"]), "--accelerator", chosen["accelerator"],
                    "--precision", chosen["precision"], "--epochs", str(EPOCH + 1), "--test_after_fit", "false",
                    "--trainer.callbacks+=benchmarks.host_time.StepWindow"]
            # "train.py before": another checkout's train.py (--before), with this file copied into its benchmarks/
            train_py = Path(chosen["before"]) / "train.py" if row == "train.py before" else launch.TRAIN_PY
            finished = launch.run_train(args, Path(folder), 600, env, train_py=train_py)
        else:
            with tempfile.TemporaryDirectory(prefix="host-time-logs-") as logs:
                job = launch.start(row, ["-m", "benchmarks.host_time", "--row", row], launch.REPO, Path(logs), env)
                timeout = launch.wait_all([job], 600)
                finished = launch.Finished(job.returncode, job.stdout, job.stderr)
                if timeout:
                    raise SystemExit(timeout)
        if finished.returncode != 0 or not out.exists():
            raise SystemExit(f"{row} exited {finished.returncode} without a window:\n{finished.stderr[-3000:]}")
        return json.loads(out.read_text())


def attribute(profile: Path, steps: int, top: int = 12) -> str:
    """The profiled window's time, in µs per step: per callback class and per module of the repository (inclusive
    time of each hook and of each top-level function), and the top functions by own time."""
    stats = pstats.Stats(str(profile)).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    repo = str(launch.REPO) + "/"
    by_module: Dict[str, float] = {}
    def ours(file: str) -> bool:
        return file.startswith(repo) and "site-packages/" not in file

    for (file, _, _), (_, _, own, _, _) in stats.items():
        if "site-packages/" in file:
            name = "/".join(file.split("site-packages/")[1].split("/")[:2])
        elif ours(file):
            name = file[len(repo):]
        else:
            name = "python, builtins, torch's C++"
        by_module[name] = by_module.get(name, 0.0) + own
    rows = sorted(by_module.items(), key=lambda item: -item[1])[:top]
    own = sorted(((v[2], f"{Path(k[0]).name}:{k[1]} {k[2]}") for k, v in stats.items()), reverse=True)[:top]
    hooks = sorted(((v[3], f"{Path(k[0]).name}:{k[1]} {k[2]}") for k, v in stats.items()
                    if ours(k[0]) and k[2].startswith(("on_", "training_step"))), reverse=True)[:top]
    per_step = 1e6 / steps
    lines = ["Own time per module (µs/step):", markdown_table(["module", "µs/step"],
                                                              [[m, f"{s * per_step:.0f}"] for m, s in rows]),
             "", "Our hooks, inclusive (µs/step):",
             markdown_table(["hook", "µs/step"], [[n, f"{s * per_step:.0f}"] for s, n in hooks]),
             "", "Top functions by own time (µs/step):",
             markdown_table(["function", "µs/step"], [[n, f"{s * per_step:.1f}"] for s, n in own])]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of " + ", ".join(ROWS))
    parser.add_argument("--network", default=DEFAULT_SETTING["network"], help="mlp8, or a --network short name")
    parser.add_argument("--batch_size", type=int, default=DEFAULT_SETTING["batch_size"])
    parser.add_argument("--accelerator", default=DEFAULT_SETTING["accelerator"], choices=["cpu", "gpu"])
    parser.add_argument("--precision", default=DEFAULT_SETTING["precision"], choices=["32-true", "bf16-mixed"])
    parser.add_argument("--before", metavar="CHECKOUT", help="also time CHECKOUT's train.py (a git worktree of an "
                        "earlier commit; this file is copied into its benchmarks/): the row 'train.py before'")
    parser.add_argument("--profile", action="store_true", help="also profile train.py's window once")
    parser.add_argument("--row", choices=ROWS[:3], help=argparse.SUPPRESS)  # a child process: one row
    args = parser.parse_args(argv)
    if args.row == "bare":
        run_bare()
        return 0
    if args.row:
        run_lightning(reference=args.row == "reference")
        return 0
    if "FASHION_MNIST_DIR" not in os.environ:
        raise SystemExit("set FASHION_MNIST_DIR to a folder holding FashionMNIST/raw (e.g. ../shared/data)")
    chosen = {key: getattr(args, key) for key in DEFAULT_SETTING}
    rows, steps = args.rows.split(","), window_steps(args.batch_size)
    if args.before:
        shutil.copy(__file__, Path(args.before) / "benchmarks" / "host_time.py")
        chosen["before"], rows = str(Path(args.before).resolve()), rows + ["train.py before"]
    times: Dict[str, List[float]] = {row: [] for row in rows}
    cpu: Dict[str, List[float]] = {row: [] for row in rows}  # the main thread's CPU time: steadier on a busy machine
    for repeat in range(args.repeats):
        for row in rows if repeat % 2 == 0 else rows[::-1]:
            window = measure(row, chosen)
            times[row].append(window["us_per_step"])
            cpu[row].append(window["cpu_us_per_step"])
            print(f"repeat {repeat + 1}: {row} {times[row][-1]:.0f} µs/step ({cpu[row][-1]:.0f} CPU)", flush=True)
    from benchmarks.speed import machine

    network = f"MLP({HIDDEN} hidden)" if args.network == "mlp8" else args.network
    print(f"\nHost time per step, µs, median (range) of {args.repeats} interleaved runs: {network}, batch "
          f"{args.batch_size}, {args.accelerator}, {args.precision}, 1 thread, steps {SKIP}-{SKIP + steps} of epoch "
          f"{EPOCH + 1}; {machine()}")
    reference = statistics.median(times["reference"]) if "reference" in times else None
    reference_cpu = statistics.median(cpu["reference"]) if "reference" in cpu else None
    print(markdown_table(["loop", "µs per step", "× reference", "CPU µs per step (main thread)", "× reference"],
                         [[row, median_range(times[row]),
                           f"{statistics.median(times[row]) / reference:.2f}" if reference else "",
                           median_range(cpu[row]),
                           f"{statistics.median(cpu[row]) / reference_cpu:.2f}" if reference_cpu else ""]
                          for row in rows]))
    if reference and "train.py" in times:
        ratio = statistics.median(times["train.py"]) / reference
        print(f"train.py / reference: {ratio:.2f} (target <= {TARGET}); in CPU time "
              f"{statistics.median(cpu['train.py']) / reference_cpu:.2f}")
    if args.profile:
        with tempfile.TemporaryDirectory() as folder:
            profile = Path(folder) / "train.prof"
            measure("train.py", chosen, profile)
            print("\n" + attribute(profile, steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
