"""NHWC (channels_last) against NCHW on this CPU: the measurement behind configs/default.yaml's memory format.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.memory_format [--networks cnn,fast_cnn,mlp] [--repeats 4]

For each network and thread count, the bare loop of ``make bench`` (a) in both formats (``--train_py``: also
train.py's steady state), back to back in alternating order; medians and the NHWC/NCHW ratio as a Markdown table.
"""

import argparse
import functools
import statistics
import sys
from typing import Callable, Dict, Tuple

import torch

from benchmarks.speed import compute_bound, interleaved, machine, train_py_rate
from benchmarks.tables import markdown_table, median_range


def bare(network: str, batch: int, seconds: float, threads: int, channels_last: bool) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return compute_bound(network, batch, seconds, channels_last=channels_last)
    finally:
        torch.set_num_threads(previous)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", default="cnn,fast_cnn,mlp")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per bare-loop measurement")
    parser.add_argument("--train_py", action="store_true", help="also train.py (cnn only), 30 steps x 3 epochs")
    opts = parser.parse_args(argv)
    batch = opts.batch_size
    plan: Dict[Tuple[str, bool], Callable[[], float]] = {}  # the two formats of a measurement back to back
    for network in opts.networks.split(","):
        for threads in (torch.get_num_threads(), 1):
            plan.update({(f"bare loop, `{network}`, {threads} thread(s)", cl):
                         functools.partial(bare, network, batch, opts.seconds, threads, cl) for cl in (False, True)})
    if opts.train_py:
        plan.update({("train.py, `cnn`, default config", cl): functools.partial(
            train_py_rate, "cnn", batch, 30, epochs=3, extra=["--model.channels_last", str(cl).lower()])
            for cl in (False, True)})
    samples = interleaved(plan, opts.repeats, lambda repeat, samples, wall: print(
        f"repeat {repeat + 1}/{opts.repeats} done", flush=True))
    print(f"\nCommand: `python -m benchmarks.memory_format {' '.join(sys.argv[1:] if argv is None else argv)}`; "
          f"batch {batch}, fp32, SGD momentum; images/sec, median of {opts.repeats} (range). Machine: {machine()}.\n")
    print(markdown_table(["measurement", "NCHW", "NHWC", "NHWC / NCHW"], [
        [name, median_range(samples[(name, False)]), median_range(samples[(name, True)]),
         f"{statistics.median(samples[(name, True)]) / statistics.median(samples[(name, False)]):.2f}"]
        for name in dict.fromkeys(name for name, _ in plan)]))


if __name__ == "__main__":
    main()
