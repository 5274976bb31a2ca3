"""`make bench`: how close train.py comes to the compute bound, and what it gains over the workshop's loop.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.speed [--network cnn] [--repeats 3]

One network and per-device batch; the measurements of ``MEASURED`` run interleaved (one repeat in order, the next
reversed) and medians are quoted, then the bare loop by batch size and the start-up times. The ceiling e2/e1: two
independent one-thread loops against one; under 2, two busy cores share something no ddp code can beat. g/e2 is
what the lockstep's wait costs, f/g what the gradient all-reduce adds, d2/f what train.py and Lightning add.
``--write`` replaces the generated section of docs/results.md.
"""

import argparse
import contextlib
import datetime
import functools
import inspect
import itertools
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
import yaml

from benchmarks import launch
from benchmarks.launch import REPO
from benchmarks.tables import markdown_table, median_range
from datamodules.fashion_mnist import PIXEL_MEAN, PIXEL_STD
from datamodules.files import default_data_dir, torchvision_root
from fashion_mnist_dp.cli.checks import import_class
from fashion_mnist_dp.cli.shorthand import CLASS_NAMES
from lightning_modules import FashionMNISTClassifier

DEFAULT_CONFIG = REPO / "configs" / "default.yaml"


def named_class(key: str, name: str) -> type:
    """The class a short name (or class path) of ``key`` stands for: ``named_class("--model.network", "cnn")``."""
    return import_class(CLASS_NAMES[key].get(name, name))


# The bare loops run in the memory format train.py runs in by default, so (a) stays its bound.
DEFAULT_CHANNELS_LAST = bool(yaml.safe_load(DEFAULT_CONFIG.read_text())["model"].get(
    "channels_last", inspect.signature(FashionMNISTClassifier).parameters["channels_last"].default))
FORMAT = "NHWC" if DEFAULT_CHANNELS_LAST else "NCHW"
# train.py's speed options, each measured against (b) with --options; the memory format row is the one
# train.py does not use by default.
OPTIONS = {
    "NCHW" if DEFAULT_CHANNELS_LAST else "NHWC": ["--model.channels_last", str(not DEFAULT_CHANNELS_LAST).lower()],
    "compile": ["--model.compile", "true"],
    "crop+flip": ["--data.random_crop_padding", "2", "--data.horizontal_flip", "true"],
}
DOC = REPO / "docs" / "results.md"
BEGIN, END = "<!-- make bench: begin -->", "<!-- make bench: end -->"
TARGETS = {"b/a": 0.95, "b/c": 1.3, "ddp speed-up": 1.85}  # marked met or missed; the ceilings inform
DDP = ("d1", "e1", "d2", "e2", "g", "f")  # left out by --skip_ddp
# What each letter measures, in the report's order.
MEASURED = {
    "a": "compute bound: bare loop on one fixed in-memory batch",
    "b": "train.py, default config, steady state (epochs 2-3)",
    "c": "workshop loop: torchvision dataset, ToTensor/Normalize per image, DataLoader (0 workers)",
    "d1": "train.py, 1 process x 1 thread",
    "d2": "train.py, ddp 2 processes x 1 thread (all ranks)",
    "e1": "ceiling: one bare loop, 1 thread",
    "e2": "ceiling: two independent bare loops at once, 1 thread each (sum)",
    "g": "the two bare loops in lockstep: one 4-byte all-reduce per step, no gradients (sum)",
    "f": "bare loop under torch's DistributedDataParallel, 2 processes x 1 thread, gloo (all ranks)",
}


def sgd_for(net: torch.nn.Module) -> torch.optim.Optimizer:
    """The default recipe's optimizer (SGD, momentum 0.9, lr 0.05), so every loop does the same work per step."""
    return torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)


def timed_steps(step: Callable[[], int], warmup: int, seconds: float, steps: int = 0) -> float:
    """Images/sec of ``step`` (returns images done) over at least ``seconds``, or over exactly ``steps`` calls when
    given (ddp ranks must all take part in every step), after ``warmup`` untimed steps."""
    for _ in range(warmup):
        step()
    images, done, start = 0, 0, time.perf_counter()
    while True:
        images += step()
        done += 1
        elapsed = time.perf_counter() - start
        if (done >= steps) if steps else (elapsed >= seconds):
            return images / elapsed


def interleaved(plan: Dict, repeats: int, report: Callable = lambda repeat, samples, wall: None) -> Dict:
    """Each of ``plan``'s measurements once per repeat, every other repeat in reverse order (a measurement's slot,
    what ran just before it, shifted e1 by 10-15 % when it always followed d2); ``report(repeat, samples, wall)``
    after each repeat, ``wall``: each measurement's seconds. Returns the samples, a list per measurement."""
    samples: Dict = {name: [] for name in plan}
    for repeat in range(repeats):
        wall = {}
        for name in plan if repeat % 2 == 0 else reversed(plan):
            begin = time.perf_counter()
            samples[name].append(plan[name]())
            wall[name] = time.perf_counter() - begin
        report(repeat, samples, wall)
    return samples


def training_step(net, optimizer, batch: Callable[[], tuple], sync: Callable[[], None] = lambda: None,
                  autocast=contextlib.nullcontext()):
    """A step of SGD on ``batch()``'s images and targets, then ``sync()``; returns the images it took."""
    def step() -> int:
        images, targets = batch()
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = F.cross_entropy(net(images), targets)
        loss.backward()
        optimizer.step()
        sync()
        return len(targets)

    return step


def compute_bound(network: str, batch: int, seconds: float, device: str = "cpu", steps: int = 0,
                  sync: str = "", channels_last: bool = DEFAULT_CHANNELS_LAST, bf16: bool = False) -> float:
    """(a) One fixed, already normalised batch: no data loading at all. ``steps``: time that many steps instead of
    ``seconds``; ``sync`` (the process group must be up): ``ddp`` wraps the network in DistributedDataParallel,
    ``lockstep`` all-reduces one number after each step; ``channels_last``: NHWC weights and batch, as train.py's
    ``--model.channels_last``; ``bf16``: under CUDA's bf16 autocast."""
    torch.manual_seed(0)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    net = named_class("--model.network", network)().to(device).train().to(memory_format=memory_format)
    optimizer = sgd_for(net)
    if sync == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(net)
    handshake = torch.zeros(1)
    images = torch.randn(batch, 1, 28, 28, device=device).contiguous(memory_format=memory_format)
    targets = torch.randint(0, 10, (batch,), device=device)

    def after() -> None:
        if sync == "lockstep":
            torch.distributed.all_reduce(handshake)
        if device == "cuda":
            torch.cuda.synchronize()

    step = training_step(net, optimizer, lambda: (images, targets), after,
                         torch.autocast(device, dtype=torch.bfloat16, enabled=bf16))
    return timed_steps(step, warmup=5 if device == "cuda" else 3, seconds=seconds, steps=steps)


def concurrent_bare_loops(network: str, batch: int, seconds: float, processes: int) -> float:
    """Summed images/sec of ``processes`` one-thread bare loops, each its own process (as ddp ranks are), timed over
    one wall-clock window: once all have imported torch and said so, they get one start instant."""
    code = ("import sys, time, torch; from benchmarks.speed import compute_bound; print('ready', flush=True); "
            "time.sleep(max(0.0, float(sys.stdin.readline()) - time.time())); "
            "print(compute_bound(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])), flush=True)")
    workers = launch.python_ranks(code, [network, batch, seconds], processes)

    def start_together() -> None:
        for worker in workers:
            if worker.stdout.readline().strip() != "ready":
                raise SystemExit(f"a bare-loop process failed to start (exit {worker.wait()})")
        for worker in workers:
            worker.stdin.write(f"{time.time() + 0.5}\n")
            worker.stdin.flush()

    return sum(float(out.split()[-1]) for out in launch.outputs(workers, start_together))


def synchronised_bare_loops(network: str, batch: int, steps: int, sync: str) -> float:
    """(f) The bare loop of (a) under DistributedDataParallel (``sync="ddp"``), or (g) two bare loops that only
    all-reduce one number per step (``"lockstep"``): 2 processes x 1 thread over gloo, ``steps`` timed steps each;
    summed images/sec of both ranks, without Lightning or train.py."""
    code = ("import sys, torch.distributed as dist; from benchmarks.speed import compute_bound; "
            "dist.init_process_group('gloo'); print(compute_bound(sys.argv[1], int(sys.argv[2]), 0.0, "
            "steps=int(sys.argv[3]), sync=sys.argv[4]), flush=True); dist.destroy_process_group()")
    workers = launch.python_ranks(code, [network, batch, steps, sync], 2, gloo=True)
    return sum(float(out.split()[-1]) for out in launch.outputs(workers))


def workshop_batches(data_dir: str, batch: int):
    """The DLI script's input pipeline: PIL image -> ToTensor -> Normalize per image, collated by a DataLoader, epoch
    after epoch (alone, with no model, it can run through the 60,000 images within a measurement)."""
    from torchvision import transforms
    from torchvision.datasets import FashionMNIST

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((PIXEL_MEAN,), (PIXEL_STD,))])
    dataset = FashionMNIST(str(torchvision_root(data_dir)), train=True, download=False, transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True)
    return (images_targets for _ in itertools.count() for images_targets in loader)


def workshop_loop(network: str, batch: int, seconds: float, data_dir: str) -> float:
    """(c) The bare loop's network trained on the workshop's input pipeline, NCHW."""
    batches = workshop_batches(data_dir, batch)
    torch.manual_seed(0)
    net = named_class("--model.network", network)().train()
    return timed_steps(training_step(net, sgd_for(net), lambda: next(batches)), warmup=3, seconds=seconds)


def data_paths(data_dir: str, batch: int, seconds: float = 4.0) -> Dict[str, float]:
    """Images/sec of the two input pipelines alone, one thread, no model: where loop (c) loses its time. train.py's
    is the datamodule's: one index gather from the in-memory uint8 split and a batched normalise."""
    from torchvision.datasets import FashionMNIST

    from datamodules.in_memory import InMemoryImages

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batches = workshop_batches(data_dir, batch)
        workshop = timed_steps(lambda: len(next(batches)[1]), warmup=1, seconds=seconds)
        raw = FashionMNIST(str(torchvision_root(data_dir)), train=True)
        split = InMemoryImages(raw.data, raw.targets)
        order = torch.randperm(len(split) - batch)

        def gather() -> int:
            start = int(order[torch.randint(len(order), ())])
            images, targets = split.__getitems__(list(range(start, start + batch)))
            images.float().div_(255.0).sub_(PIXEL_MEAN).div_(PIXEL_STD)
            return len(targets)

        ours = timed_steps(gather, warmup=1, seconds=seconds)
    finally:
        torch.set_num_threads(threads)
    return {"workshop": workshop, "train.py": ours}


def train_py_rate(network: str, batch: int, steps, epochs: int, extra=(), threads=None, first_step=False,
                  accelerator: str = "cpu"):
    """(b)/(d) Median images/sec of epochs 2..``epochs`` from train.py's own record, ``steps`` per epoch (1.0: all),
    without validation (not in the images/sec; ``0``: the CLI reads ``1`` as the float 1.0, all of it); ``first_step``:
    also the first step's seconds (``time/first_step_s``: with compile, compilation). benchmarks/gpu.py's runs too."""
    record = launch.train_record(["--config", str(DEFAULT_CONFIG), "--accelerator", accelerator, "--network", network,
                                  "--batch_size", str(batch), "--epochs", str(epochs), "--trainer.limit_train_batches",
                                  str(steps), "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
                                  "--test_after_fit", "false", *extra], threads=threads)
    rates = {e.epoch: e.images_per_sec for e in record.epochs}
    steady = [rates[e] for e in range(2, epochs + 1) if rates.get(e) is not None]
    if not steady:
        raise SystemExit(f"no epochs in train.py's record ({record.folder})")
    if first_step:
        return statistics.median(steady), record.latest.get("time/first_step_s")
    return statistics.median(steady)


def wall_seconds(command: List[str]) -> float:
    """Wall-clock seconds of ``command`` in a scratch folder (torch's own thread count, the data folder kept);
    NaN (with its error on stderr) if it fails, so that a failure here does not throw away the measurements made
    before."""
    env = launch.clean_env(keep_data_dir=True)
    env.pop("OMP_NUM_THREADS")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        print(f"{' '.join(command[1:])} failed (exit {result.returncode}): {result.stderr[-500:]}", file=sys.stderr)
        return float("nan")
    return time.perf_counter() - start


def machine() -> str:
    import lightning

    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{model}, {os.cpu_count()} cores, {gpu}; Python {platform.python_version()}, torch {torch.__version__}, "
            f"lightning {lightning.__version__}, {torch.get_num_threads()} torch threads")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="cnn")
    parser.add_argument("--batch_size", type=int, default=128, help="per device, as everywhere")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15, help="train.py steps per epoch (3 epochs, 2 timed)")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per bare-loop measurement")
    parser.add_argument("--skip_ddp", action="store_true", help="leave out (d), e.g. for a second network")
    parser.add_argument("--data_only", action="store_true",
                        help="only time the two input pipelines alone (no model) and exit")
    parser.add_argument("--options", action="store_true",
                        help="also measure train.py's speed options (channels_last, compile, augmentation) against (b)")
    parser.add_argument("--write", action="store_true", help="replace the generated section of docs/results.md")
    opts = parser.parse_args(argv)
    data_dir = default_data_dir()
    raw = torchvision_root(data_dir) / "FashionMNIST" / "raw"
    if not (raw / "train-images-idx3-ubyte").is_file():
        raise SystemExit(f"make bench needs the Fashion-MNIST IDX files in {raw.resolve()}: "
                         "set FASHION_MNIST_DIR to a folder holding FashionMNIST/raw (e.g. ../shared/data)")
    net, batch, seconds, steps = opts.network, opts.batch_size, opts.seconds, opts.steps
    if opts.data_only:
        for name, rate in data_paths(data_dir, batch).items():
            print(f"{name} input pipeline alone, 1 thread: {rate:.0f} images/sec, "
                  f"{1000 * batch / rate:.2f} ms per batch of {batch}")
        return
    options = OPTIONS if opts.options else {}
    first_steps: Dict[str, List[float]] = {name: [] for name in options}

    def option_rate(name: str, flags: List[str]) -> float:
        rate, first_step = train_py_rate(net, batch, steps, epochs=3, extra=flags, first_step=True)
        first_steps[name].append(first_step)
        return rate

    plan: Dict[str, Callable[[], float]] = {
        "a": lambda: compute_bound(net, batch, seconds),
        "b": lambda: train_py_rate(net, batch, steps, epochs=3),
        "c": lambda: workshop_loop(net, batch, seconds, data_dir),
        "d1": lambda: train_py_rate(net, batch, steps, epochs=3, threads=1),
        "e1": lambda: concurrent_bare_loops(net, batch, seconds, processes=1),
        "d2": lambda: train_py_rate(net, batch, steps, epochs=3, threads=1,
                                    extra=["--strategy", "ddp", "--devices", "2"]),
        "e2": lambda: concurrent_bare_loops(net, batch, seconds, processes=2),
        "g": lambda: synchronised_bare_loops(net, batch, steps, sync="lockstep"),
        "f": lambda: synchronised_bare_loops(net, batch, steps, sync="ddp"),
        **{name: functools.partial(option_rate, name, flags) for name, flags in options.items()},
    }
    if opts.skip_ddp:
        plan = {name: rate for name, rate in plan.items() if name not in DDP}
    started = time.perf_counter()
    samples = interleaved(plan, opts.repeats, lambda repeat, samples, wall: print(
        f"repeat {repeat + 1}/{opts.repeats} (images/sec, wall seconds): "
        + ", ".join(f"{k} {v[-1]:.0f} ({wall[k]:.0f} s)" for k, v in samples.items()), flush=True))
    m = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {"b/a": m["b"] / m["a"], "b/c": m["b"] / m["c"]}
    if not opts.skip_ddp:
        ratios.update({"ddp speed-up": m["d2"] / m["d1"], "ceiling e2/e1": m["e2"] / m["e1"],
                       "synchronous ceiling g/e1": m["g"] / m["e1"]})
        ratios["ddp speed-up / synchronous ceiling"] = ratios["ddp speed-up"] / ratios["synchronous ceiling g/e1"]
        ratios.update({"lockstep wait g/e2": m["g"] / m["e2"], "gradient all-reduce f/g": m["f"] / m["g"],
                       "train.py ddp d2/f": m["d2"] / m["f"]})

    begin = time.perf_counter()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    by_batch = [[size] + [compute_bound(net, size, seconds=2.0, device=device) for device in devices]
                for size in (2, 4, 16, 64, 128, 256, 512)]
    print(f"batch-size table: {time.perf_counter() - begin:.0f} s", flush=True)
    begin = time.perf_counter()
    # Start-up costs, interleaved so that a slow minute of the VM does not land on one of them. What --help cannot
    # avoid: Lightning imports torchmetrics, whose package import pulls in torchvision.models and with it
    # torch._dynamo (python -X importtime train.py --help shows the chain).
    startup_commands = {
        "help": [sys.executable, str(REPO / "train.py"), "--help"],
        "torch": [sys.executable, "-c", "import torch"],
        "lightning.pytorch": [sys.executable, "-c", "import lightning.pytorch"],
        "first step": [sys.executable, str(REPO / "train.py"), "--config", str(DEFAULT_CONFIG), "--accelerator", "cpu",
                       "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--test_after_fit", "false"],
    }
    startup: Dict[str, List[float]] = {name: [] for name in startup_commands}
    for _ in range(3):
        for name, command in startup_commands.items():
            startup[name].append(wall_seconds(command))
    startup_s = {name: statistics.median(values) for name, values in startup.items()}
    print(f"--help and start-up, 3 times each: {time.perf_counter() - begin:.0f} s", flush=True)

    lines = [
        f"Command: `FASHION_MNIST_DIR=../shared/data python -m benchmarks.speed "
        f"{' '.join(sys.argv[1:] if argv is None else argv)}` (`make bench` runs it with `--write`; defaults: "
        f"--network {net} --batch_size {batch} --repeats {opts.repeats} --steps {steps} --seconds {seconds:g}), "
        f"{datetime.date.today().isoformat()}, {time.perf_counter() - started:.0f} s.",
        "", f"Machine: {machine()}.", "",
        f"Network `{net}`, batch {batch} per process, fp32, SGD momentum 0.9, {FORMAT} (train.py's default; "
        f"the workshop loop c: NCHW). Images/sec, median of {opts.repeats} interleaved repeats (range in brackets).",
        "",
        markdown_table(["", "measurement", "images/sec"], [[key, text, median_range(samples[key])]
                                                         for key, text in MEASURED.items() if key in samples]), "",
        markdown_table(["ratio", "measured", "target", ""], [
            [name, f"{value:.2f}", *([f">= {TARGETS[name]}", "met" if value >= TARGETS[name] else "missed"]
                                     if name in TARGETS else ["", ""])] for name, value in ratios.items()])]
    if options:
        lines += ["", "train.py's options against (b), steady state; first: the first epoch's seconds, or with "
                      "compile the first step's (compilation):", "",
                  markdown_table(["option", "images/sec", "vs (b)", "first epoch / step s"], [
                      [name, median_range(samples[name]), f"{m[name] / m['b']:.2f}",
                       f"{statistics.median(first_steps[name]):.1f}"] for name in options])]
    lines += ["", f"Bare-loop throughput by batch size (`{net}`, fp32, {FORMAT}):", "",
              markdown_table(["batch", *(f"{d} images/sec" for d in devices)],
                             [[str(row[0]), *(f"{v:.0f}" for v in row[1:])] for row in by_batch])]
    if not torch.cuda.is_available():
        lines += ["", "GPU rows: no GPU on this machine (unverified)."]
    lines += ["", f"`python train.py --help`: {startup_s['help']:.1f} s; `python -c \"import torch\"`: "
                  f"{startup_s['torch']:.1f} s; `import lightning.pytorch` (torch included): "
                  f"{startup_s['lightning.pytorch']:.1f} s; start-up to the end of the first optimizer step "
                  f"(`--trainer.max_steps 1 --trainer.limit_val_batches 0`, the default config's logger and "
                  f"checkpoints): {startup_s['first step']:.1f} s (medians of 3, interleaved)."]
    report = "\n".join(lines)
    print("\n" + report)
    if opts.write:
        text = DOC.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            text = head + BEGIN + "\n" + report + "\n" + END + rest.split(END, 1)[1]
        else:
            text = text.rstrip() + f"\n\n## `make bench`\n\n{BEGIN}\n{report}\n{END}\n"
        DOC.write_text(text)
        print(f"\nwrote {DOC.relative_to(REPO)}")


if __name__ == "__main__":
    main()
