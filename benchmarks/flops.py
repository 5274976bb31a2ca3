"""Training FLOPs per image of the shipped networks, this machine's CPU peak, and the MFU of images/sec figures, with
the same functions a run uses (callbacks/flops.py; docs/reporting.md, "Against the hardware"):

    python -m benchmarks.flops                                 # each network's FLOPs per image; the CPU probe, 5 times
    python -m benchmarks.flops --threads 1 --dtype bfloat16    # the probe on one thread, in bf16
    python -m benchmarks.flops --rate cnn=2196 --rate wrn=1835/4 --peak 8.1e12   # MFU of images/sec [over devices]
    python -m benchmarks.flops --bare cnn --bare fast_cnn      # make bench's bare loop (a), its MFU, probe by probe

A ``--rate`` is ``NETWORK=IMAGES_PER_SEC`` (all devices) or ``.../DEVICES``; its MFU is against ``--peak`` (one
device's FLOP/s), else the median of the probes here. ``--bare``: benchmarks/speed.py's compute-bound loop (one
fixed batch in memory, fp32, NHWC, SGD), ``--seconds`` at a time, each after a probe in the same process.
"""

import argparse
import copy
import statistics
import time

import torch
from lightning.fabric.utilities.throughput import measure_flops

from callbacks.flops import PROBE_S, cpu_peak, si, training_flops
from fashion_mnist_dp.cli.checks import import_class
from fashion_mnist_dp.cli.shorthand import CLASS_NAMES

NETWORKS = CLASS_NAMES["--model.network"]  # short name -> class path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the probe (default: torch's)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--probes", type=int, default=5, help="CPU probes (a run makes one at start-up)")
    parser.add_argument("--rate", action="append", default=[], help="NETWORK=IMAGES_PER_SEC[/DEVICES]")
    parser.add_argument("--peak", type=float, default=None, help="one device's peak FLOP/s for --rate")
    parser.add_argument("--bare", action="append", default=[], help="a network for make bench's bare loop (a)")
    parser.add_argument("--batch_size", type=int, default=128, help="the bare loop's batch")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per bare-loop measurement")
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)

    print("| network | class | parameters | training FLOPs per image | forward | counted in |")
    print("|---|---|---|---|---|---|")
    flops = {}
    for name, path in NETWORKS.items():
        network = import_class(path)().to(memory_format=torch.channels_last)
        began = time.perf_counter()
        flops[name] = training_flops(network, batch=128)
        took = time.perf_counter() - began
        meta, images = copy.deepcopy(network).to("meta"), torch.zeros(2, 1, 28, 28, device="meta")
        forward = measure_flops(meta, lambda: meta(images)) / 2
        parameters = sum(p.numel() for p in network.parameters())
        print(f"| `{name}` | {path.rpartition('.')[2]} | {parameters / 1e6:.2f} M | {si(flops[name], 'FLOP')} | "
              f"{si(forward, 'FLOP')} | {took:.2f} s |")

    dtype = getattr(torch, opts.dtype)
    probes = [cpu_peak(dtype) for _ in range(opts.probes)]
    peaks = [peak for peak, _ in probes]
    print(f"\nCPU probe ({opts.dtype} matmul, {torch.get_num_threads()} thread(s), at most {PROBE_S} s each), "
          f"{opts.probes} probes: median {si(statistics.median(peaks), 'FLOP/s')} "
          f"({si(min(peaks), 'FLOP/s')}-{si(max(peaks), 'FLOP/s')}), each in "
          f"{min(s for _, s in probes):.2f}-{max(s for _, s in probes):.2f} s")

    peak = opts.peak or statistics.median(peaks)
    for name in opts.bare:  # each measurement beside a probe of its own, so both see the machine alike
        from benchmarks.speed import compute_bound

        pairs = [(compute_bound(name, opts.batch_size, opts.seconds), cpu_peak(dtype)[0]) for _ in range(opts.probes)]
        mfus = [rate * flops[name] / probe for rate, probe in pairs]
        rates, probes = ", ".join(f"{rate:.0f}" for rate, _ in pairs), ", ".join(si(p, "FLOP/s") for _, p in pairs)
        print(f"\nbare loop `{name}`, batch {opts.batch_size}, {torch.get_num_threads()} thread(s): images/sec "
              f"{rates}; probes {probes}; MFU {', '.join(f'{100 * m:.1f} %' for m in mfus)}: median "
              f"{100 * statistics.median(mfus):.1f} %")
    if opts.rate:
        print(f"\n| network | images/sec | devices | FLOP/s per device | MFU (of {si(peak, 'FLOP/s')}) |")
        print("|---|---|---|---|---|")
    for rate in opts.rate:
        name, _, figure = rate.partition("=")
        images, _, devices = figure.partition("/")
        achieved = float(images) / int(devices or 1) * flops[name]
        print(f"| `{name}` | {float(images):,.0f} | {devices or 1} | {si(achieved, 'FLOP/s')} | "
              f"{100 * achieved / peak:.1f} % |")


if __name__ == "__main__":
    main()
