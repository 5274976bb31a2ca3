"""GPU figures for docs/lab/gpu.md: what the fast path gives on one CUDA GPU.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.gpu table      # bare loop by batch size, fp32 and bf16
    FASHION_MNIST_DIR=../shared/data python -m benchmarks.gpu options    # train.py's speed options, steady state
    FASHION_MNIST_DIR=../shared/data python -m benchmarks.gpu smoke      # ddp (NCCL), dp and fsdp each train 20 steps

Each prints a Markdown table and the machine; 2 interleaved repeats (GPU timings are stable). The CPU half is
``make bench``; the recipes' time to accuracy is ``benchmarks/recipe_runs.py`` with a GPU recipe.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch
import yaml

from benchmarks import launch
from benchmarks.speed import DEFAULT_CONFIG, compute_bound, machine, train_py_rate
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


def bare_loop(network: str, batch: int, seconds: float, bf16: bool) -> float:
    """Compute bound on the GPU, NCHW: one fixed batch in GPU memory, synchronised every step."""
    return compute_bound(network, batch, seconds, device="cuda", channels_last=False, bf16=bf16)


def table(opts) -> List[str]:
    rows = []
    for size in (2, 4, 16, 64, 128, 256, 512, 1024, 4096):
        rows.append([str(size), *(f"{bare_loop(opts.network, size, opts.seconds, x):.0f}" for x in (False, True))])
        print(rows[-1], flush=True)
    return [f"Bare loop on one GPU by batch size (`{opts.network}`, SGD momentum, one fixed batch in GPU memory, "
            f"synchronised every step; {opts.seconds:g} s per cell):", "",
            markdown_table(["batch", "fp32 images/sec", "bf16 autocast images/sec"], rows)]


def backend(runs: Path) -> str:
    """The process group backend of the newest run under ``runs``, from its hparams.yaml."""
    found = run_dirs(runs)
    return (yaml.safe_load((found[-1] / "hparams.yaml").read_text()) if found else {}).get("backend", "no record")


def options(opts) -> List[str]:
    variants = {name: VARIANTS[name] for name in (["fp32"] + opts.only if opts.only else list(VARIANTS))}
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    first_steps: Dict[str, float] = {}
    for repeat in range(opts.repeats):
        for name, flags in variants.items():
            try:
                rate, first = train_py_rate(opts.network, opts.batch_size, 1.0, opts.epochs, ["--devices", "1", *flags],
                                            first_step=True, accelerator="gpu")
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
    rows = []
    for name, values in samples.items():
        rate, a = statistics.median(values or [0]), bound["bf16" if "16" in name else "fp32"]
        note = f" (first step {first_steps[name]:.1f} s)" if name in first_steps else ""
        rows.append([f"{name}{note}", median_range(values), f"{rate / base:.2f}", f"{rate / a:.2f}"] if values
                    else [name, "failed", "", ""])
    return [f"train.py on one GPU, `{opts.network}`, batch {opts.batch_size}, full epochs, steady state (epochs 2-"
            f"{opts.epochs}), median of {opts.repeats} interleaved repeats; a = the bare loop at the same batch "
            f"(fp32 {bound['fp32']:.0f}, bf16 {bound['bf16']:.0f} images/sec):", "",
            markdown_table(["variant", "images/sec", "vs fp32", "b/a"], rows)]


def smoke(opts) -> List[str]:
    """ddp over NCCL, dp and fsdp on the one GPU: each trains 20 steps and validates; the backend is read back."""
    rows = []
    for strategy in ("ddp", "dp", "fsdp"):
        started = time.perf_counter()
        try:
            note, code = launch.train_record(["--config", str(DEFAULT_CONFIG), "--accelerator", "gpu",
                                              "--devices", "1", "--strategy", strategy, "--epochs", "1",
                                              "--trainer.limit_train_batches", "20", "--trainer.limit_val_batches", "2",
                                              "--test_after_fit", "false"], 300, read=backend), 0
        except SystemExit as error:
            note, code = str(error).splitlines()[-1][:120], 1
        rows.append([strategy, str(code), note, f"{time.perf_counter() - started:.0f}"])
        print(rows[-1], flush=True)
    return [markdown_table(["strategy", "exit", "backend / note", "seconds"], rows)]


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
