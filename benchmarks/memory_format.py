"""NHWC (channels_last) against NCHW on this CPU: the measurement behind configs/default.yaml's memory format.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.memory_format [--networks cnn,fast_cnn,mlp] [--repeats 4]

For each network and thread count, the bare loop of ``make bench`` (a) in both formats (``--train_py``: also
train.py's steady state), back to back in alternating order; medians and the NHWC/NCHW ratio as a Markdown table.
"""

import argparse
import statistics
import sys
from typing import Callable, Dict, List, Tuple

import torch

from benchmarks.speed import compute_bound, machine, train_py_rate
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
    pairs: List[Tuple[str, Dict[bool, Callable[[], float]]]] = []
    for network in opts.networks.split(","):
        for threads in (torch.get_num_threads(), 1):
            pairs.append((f"bare loop, `{network}`, {threads} thread(s)",
                          {cl: (lambda n=network, t=threads, c=cl: bare(n, batch, opts.seconds, t, c))
                           for cl in (False, True)}))
    if opts.train_py:
        pairs.append(("train.py, `cnn`, default config",
                      {cl: (lambda c=cl: train_py_rate("cnn", batch, 30, epochs=3,
                                                       extra=["--model.channels_last", str(c).lower()]))
                       for cl in (False, True)}))
    samples: Dict[Tuple[str, bool], List[float]] = {}
    for repeat in range(opts.repeats):
        for name, rates in pairs:
            for channels_last in ((False, True) if repeat % 2 == 0 else (True, False)):
                samples.setdefault((name, channels_last), []).append(rates[channels_last]())
        print(f"repeat {repeat + 1}/{opts.repeats} done", flush=True)
    print(f"\nCommand: `python -m benchmarks.memory_format {' '.join(sys.argv[1:] if argv is None else argv)}`; "
          f"batch {batch}, fp32, SGD momentum; images/sec, median of {opts.repeats} (range). Machine: {machine()}.\n")
    print(markdown_table(["measurement", "NCHW", "NHWC", "NHWC / NCHW"], [
        [name, median_range(samples[(name, False)]), median_range(samples[(name, True)]),
         f"{statistics.median(samples[(name, True)]) / statistics.median(samples[(name, False)]):.2f}"]
        for name, _ in pairs]))


if __name__ == "__main__":
    main()
