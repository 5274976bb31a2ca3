"""GPU figures for docs/benchmarks.md: what the fast path gives on one CUDA GPU.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.gpu table      # bare loop by batch size, fp32 and bf16
    FASHION_MNIST_DIR=../shared/data python -m benchmarks.gpu options    # train.py's speed options, steady state
    FASHION_MNIST_DIR=../shared/data python -m benchmarks.gpu smoke      # ddp (NCCL), dp and fsdp each train 20 steps

Each prints a Markdown table (and the machine) to paste into docs/benchmarks.md. GPU timings
are stable enough for 2 interleaved repeats; the CPU half of the story is ``make bench``.
The recipes' time to accuracy is ``benchmarks/recipe_runs.py`` with a GPU recipe.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F
import yaml

from benchmarks.speed import machine, named_class, sgd_for, timed_steps
from benchmarks import launch
from benchmarks.launch import REPO
from benchmarks.tables import markdown_table, median_range
from callbacks.run_record import run_dirs

# train.py flags of each measured variant, on top of the GPU baseline (fp32, splits in GPU memory). The memory
# format is explicit in every row: configs/default.yaml trains NHWC, the bare loop of `table` NCHW.
NCHW = ["--model.channels_last", "false"]
VARIANTS = {
    "fp32": NCHW,
    "fp32 + channels_last (the default config)": [],
    "fp32, splits in host memory (pinned DataLoader)": NCHW + ["--data.keep_on_device", "false"],
    "bf16-mixed": NCHW + ["--trainer.precision", "bf16-mixed"],
    "16-mixed": NCHW + ["--trainer.precision", "16-mixed"],
    "bf16-mixed + channels_last": ["--trainer.precision", "bf16-mixed"],
    "bf16-mixed + channels_last + cudnn benchmark": ["--trainer.precision", "bf16-mixed",
                                                     "--trainer.benchmark", "true"],
    "bf16-mixed + compile": NCHW + ["--trainer.precision", "bf16-mixed", "--model.compile", "true"],
    # What the default callbacks (divergence guard, LR monitor, checkpoints, memory) cost per step.
    "fp32, ThroughputReport the only callback": NCHW + ["--trainer.callbacks",
                                                        "[{class_path: callbacks.ThroughputReport}]"],
}


def bare_loop(network: str, batch: int, seconds: float, bf16: bool, channels_last: bool = False) -> float:
    """Compute bound on the GPU: one fixed batch in GPU memory, forward/backward/SGD, synchronised each step."""
    torch.manual_seed(0)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    net = named_class("--model.network", network)().cuda().train().to(memory_format=memory_format)
    optimizer = sgd_for(net)
    images = torch.randn(batch, 1, 28, 28, device="cuda").to(memory_format=memory_format)
    targets = torch.randint(0, 10, (batch,), device="cuda")

    def step() -> int:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(images), targets)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        return batch

    return timed_steps(step, warmup=5, seconds=seconds)


def table(opts) -> List[str]:
    lines = [f"Bare loop on one GPU by batch size (`{opts.network}`, SGD momentum, one fixed batch in GPU memory, "
             f"synchronised every step; {opts.seconds:g} s per cell):", "",
             markdown_table(["batch", "fp32 images/sec", "bf16 autocast images/sec"], [])]
    for size in (2, 4, 16, 64, 128, 256, 512, 1024, 4096):
        fp32 = bare_loop(opts.network, size, opts.seconds, bf16=False)
        bf16 = bare_loop(opts.network, size, opts.seconds, bf16=True)
        lines.append(f"| {size} | {fp32:.0f} | {bf16:.0f} |")
        print(lines[-1], flush=True)
    return lines


def train_py(args: List[str], timeout: float = 600, read=None):
    """train.py with the default config in a scratch folder, its record (or ``read``'s); SystemExit when it fails."""
    return launch.train_record(["--config", str(REPO / "configs" / "default.yaml"), *args], timeout, read=read)


def backend(runs: Path) -> str:
    """The process group backend of the newest run under ``runs``, from its hparams.yaml."""
    found = run_dirs(runs)
    hparams = yaml.safe_load((found[-1] / "hparams.yaml").read_text()) if found else {}
    return hparams.get("backend", "no record")


def steady_rate(network: str, batch: int, epochs: int, extra: List[str]):
    """Median images/sec of epochs 2..n of full epochs on the GPU, and the first step's seconds if printed.
    No validation (not in the images/sec; ``1`` would mean all of it: the CLI reads it as the float 1.0)."""
    record = train_py(["--accelerator", "gpu", "--devices", "1", "--network", network, "--batch_size", str(batch),
                    "--epochs", str(epochs), "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
                    "--test_after_fit", "false", *extra])
    rates = {epoch.epoch: epoch.images_per_sec for epoch in record.epochs}
    return statistics.median(rates[e] for e in range(2, epochs + 1)), record.latest.get("time/first_step_s")


def options(opts) -> List[str]:
    variants = {name: VARIANTS[name] for name in (["fp32"] + opts.only if opts.only else list(VARIANTS))}
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    first_steps: Dict[str, float] = {}
    for repeat in range(opts.repeats):
        for name, flags in variants.items():
            try:
                rate, first = steady_rate(opts.network, opts.batch_size, opts.epochs, flags)
            except SystemExit as error:
                print(f"{name}: {error}", flush=True)
                continue
            samples[name].append(rate)
            if first is not None:
                first_steps[name] = first
            print(f"repeat {repeat + 1}: {name}: {rate:.0f} images/sec", flush=True)
    bound = {dtype: bare_loop(opts.network, opts.batch_size, opts.seconds, bf16=(dtype == "bf16"))
             for dtype in ("fp32", "bf16")}
    base = statistics.median(samples["fp32"]) if samples["fp32"] else float("nan")
    lines = [f"train.py on one GPU, `{opts.network}`, batch {opts.batch_size}, full epochs, steady state (epochs 2-"
             f"{opts.epochs}), median of {opts.repeats} interleaved repeats; a = the bare loop at the same batch "
             f"(fp32 {bound['fp32']:.0f}, bf16 {bound['bf16']:.0f} images/sec):", ""]
    rows = []
    for name, values in samples.items():
        if not values:
            rows.append([name, "failed", "", ""])
            continue
        rate = statistics.median(values)
        a = bound["bf16" if "16" in name else "fp32"]
        note = f" (first step {first_steps[name]:.1f} s)" if name in first_steps else ""
        rows.append([f"{name}{note}", median_range(values), f"{rate / base:.2f}", f"{rate / a:.2f}"])
    return lines + [markdown_table(["variant", "images/sec", "vs fp32", "b/a"], rows)]


def smoke(opts) -> List[str]:
    """ddp over NCCL, dp and fsdp on the one GPU: each trains 20 steps and validates; the backend is read back."""
    lines = [markdown_table(["strategy", "exit", "backend / note", "seconds"], [])]
    for strategy in ("ddp", "dp", "fsdp"):
        started = time.perf_counter()
        try:
            note = train_py(["--accelerator", "gpu", "--devices", "1", "--strategy", strategy, "--epochs", "1",
                             "--trainer.limit_train_batches", "20", "--trainer.limit_val_batches", "2",
                             "--test_after_fit", "false"], timeout=300, read=backend)
            code = 0
        except SystemExit as error:
            note, code = str(error).splitlines()[-1][:120], 1
        lines.append(f"| {strategy} | {code} | {note} | {time.perf_counter() - started:.0f} |")
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["table", "options", "smoke"])
    parser.add_argument("--network", default="cnn")
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=3, help="options: full epochs per run, the first not timed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", action="append", choices=list(VARIANTS),
                        help="options: measure these variants (and fp32, the reference) only; repeatable")
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per bare-loop measurement")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu needs a CUDA GPU; the CPU figures come from `make bench`")
    started = time.perf_counter()
    lines = {"table": table, "options": options, "smoke": smoke}[opts.what](opts)
    print(f"\nCommand: `python -m benchmarks.gpu {' '.join(sys.argv[1:] if argv is None else argv)}`, "
          f"{time.perf_counter() - started:.0f} s. Machine: {machine()}.\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
