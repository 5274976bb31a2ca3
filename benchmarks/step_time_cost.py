"""What the step-time breakdown costs: train.py with it on and off, in interleaved pairs, images/sec of the steady
epochs (2..) from each run's metrics.csv; the median of the pairs' on/off ratios. Part of `make bench`.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.step_time_cost [--pairs 10] [--devices 2]
    ... --accelerator gpu --devices 1 [--precision bf16-mixed]    # on a GPU: ddp on one device, hooks and events on

On and off are ``--breakdown true`` and ``--breakdown false``; ``--on=FLAGS --off=FLAGS`` times any other two
variants the same way (benchmarks/gpu_checks.sh, stage ema).
"""

import argparse
import functools
import shlex
import statistics
import sys

from benchmarks.speed import interleaved, machine
from benchmarks import launch


def rate(args, extra) -> float:
    precision = ["--trainer.precision", args.precision] if args.precision else []
    record = launch.train_record([*extra, *precision, "--strategy", "ddp", "--devices", str(args.devices),
                                  "--accelerator", args.accelerator, "--network", args.network,
                                  "--data.train_subset", str(args.train_subset), "--epochs", str(args.epochs),
                                  "--trainer.limit_val_batches", "1", "--test_after_fit", "false"], 1800, threads=1)
    return statistics.median(e.images_per_sec for e in record.epochs[1:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_time_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--network", default="cnn")
    parser.add_argument("--train_subset", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--on", default="--breakdown true", help="train.py flags of the variant under test")
    parser.add_argument("--off", default="--breakdown false", help="train.py flags of the baseline")
    args = parser.parse_args(argv)
    plan = {name: functools.partial(rate, args, shlex.split(flags)) for name, flags in (("on", args.on),
                                                                                        ("off", args.off))}
    got = interleaved(plan, args.pairs, lambda pair, got, wall: print(  # on first in even pairs, off in odd ones
        f"pair {pair + 1}: on {got['on'][-1]:.0f}, off {got['off'][-1]:.0f} images/sec, on/off "
        f"{got['on'][-1] / got['off'][-1]:.3f}", flush=True))
    on, off = got["on"], got["off"]
    ratios = [a / b for a, b in zip(on, off)]
    print(f"\n{args.devices} {args.accelerator} rank(s) (ddp, {args.precision or '32-true'}), {args.network}, "
          f"{args.train_subset} images x {args.epochs} epochs (steady epochs 2..); {machine()}")
    print(f"on ({args.on}) / off ({args.off}): median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}) over {args.pairs} interleaved pairs; "
          f"on {statistics.median(on):.0f}, off {statistics.median(off):.0f} images/sec")
    return 0


if __name__ == "__main__":
    sys.exit(main())
