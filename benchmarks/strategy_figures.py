"""The figures in docs/strategies.md: model state per rank (ddp vs fsdp) and images/sec (1 vs 2 processes).

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.strategy_figures [--repeats 3] [--batches 60]

Every figure is read from the run's own record (metrics.csv); throughput runs alternate 1-process and 2-process
jobs and quote medians of the second epoch's images/sec (the first pays for start-up).
"""

import argparse
import os
import statistics

from benchmarks import launch
from benchmarks.speed import machine
from benchmarks.tables import markdown_table


def train(args, threads=None):
    """Run train.py in a scratch folder; return its record (metrics.csv)."""
    common = ["--accelerator", "cpu", "--test_after_fit", "false", "--trainer.enable_checkpointing", "false",
              "--trainer.callbacks", "callbacks.ThroughputReport", "--trainer.callbacks+=callbacks.PeakMemory"]
    return launch.train_record([*common, *args], 1800, threads)


def model_state(network: str, strategy: str, batch: int) -> tuple:
    record = train(["--strategy", strategy, "--devices", "2", "--network", network, "--batch_size", str(batch),
                    "--data.eval_batch_size", str(batch), "--epochs", "1", "--trainer.num_sanity_val_steps", "0",
                    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"])
    return record.latest["memory/parameters_mb"], record.latest["memory/optimizer_state_mb"]


def images_per_sec(devices: int, strategy: str, batches: int, threads) -> float:
    record = train(["--strategy", strategy, "--devices", str(devices), "--epochs", "2",
                    "--trainer.num_sanity_val_steps", "0", "--trainer.limit_train_batches", str(batches),
                    "--trainer.limit_val_batches", "1"], threads)
    return next(epoch.images_per_sec for epoch in record.epochs if epoch.epoch == 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60, help="training steps per epoch per process")
    opts = parser.parse_args()
    if not os.environ.get("FASHION_MNIST_DIR"):
        raise SystemExit("set FASHION_MNIST_DIR to a folder holding FashionMNIST/raw (e.g. ../shared/data)")

    print(f"machine: {machine()}")
    states = [[network, strategy, *(f"{mb:.2f}" for mb in model_state(network, strategy, batch))]
              for network, batch in (("cnn", 128), ("wrn", 8)) for strategy in ("ddp", "fsdp")]
    print("\n" + markdown_table(["network", "strategy", "parameters / rank (MiB)", "optimizer state / rank (MiB)"],
                                states))

    # Same machine, both configurations use all cores: 1 process x all threads vs 2 processes x half.
    cores = os.cpu_count() or 2
    jobs = {
        f"1 process x {cores} threads": (1, "auto", cores),
        f"2 processes (ddp) x {max(1, cores // 2)} thread(s)": (2, "ddp", max(1, cores // 2)),
        f"2 processes (fsdp) x {max(1, cores // 2)} thread(s)": (2, "fsdp", max(1, cores // 2)),
    }
    rates = {name: [] for name in jobs}
    for _ in range(opts.repeats):  # interleaved, so drift in machine load hits every job alike
        for name, (devices, strategy, threads) in jobs.items():
            rates[name].append(images_per_sec(devices, strategy, opts.batches, threads))
    base = statistics.median(rates[next(iter(jobs))])
    print(f"\ncnn, batch 128 per process, {opts.batches} steps per epoch, epoch 2, median of {opts.repeats}\n")
    print(markdown_table(["job", "images/sec (median)", "runs", "vs 1 process"], [
        [name, f"{statistics.median(values):.0f}", ", ".join(f"{v:.0f}" for v in values),
         f"{statistics.median(values) / base:.2f}x"] for name, values in rates.items()]))


if __name__ == "__main__":
    main()
