"""How data-parallel training scales: images/sec for 1..64 ranks predicted from one rank, then checked by runs.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m experiments.scaling [--runs 5] [--network cnn]
    .venv/bin/python -m experiments.scaling --workshop     # the DLI workshop's 4 GPUs, on paper (docs/scaling.md)

The model (T(n) from one rank's breakdown, an all-reduce sweep and a contention pair; no prediction for n ranks uses a
run of n ranks): docs/scaling.md. Prints the table and writes docs/figures/scaling.csv and scaling.png.
"""

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks import launch
from benchmarks.launch import REPO
from benchmarks.tables import figure, markdown_table, write_csv

DEVICES = (1, 2, 4, 8, 16, 32, 64)
BUSY = ("data", "forward", "backward", "optimizer", "other")  # a rank's own work: all but comm and wait
BUCKET_BYTES, FIRST_BUCKET_BYTES = 25 * 2 ** 20, 2 ** 20  # DDP's defaults: bucket_cap_mb 25, the first 1 MiB


@dataclass(frozen=True)
class OneRank:
    """One rank's step, in seconds, at ``batch`` images per step; ``sigma``: the spread of its step times."""

    batch: int
    data: float
    forward: float
    backward: float
    optimizer: float
    other: float
    sigma: float

    @property
    def step(self) -> float:
        return self.data + self.forward + self.backward + self.optimizer + self.other


@dataclass(frozen=True)
class Link:
    """The α-β cost of one message: ``alpha`` seconds of latency, ``bandwidth`` bytes per second."""

    alpha: float
    bandwidth: float


def buckets(gradient_bytes: int) -> int:
    """DDP's bucket count for S gradient bytes: the first 1 MiB, then 25 MiB each."""
    return 1 + max(0, math.ceil((gradient_bytes - FIRST_BUCKET_BYTES) / BUCKET_BYTES))


def ring_allreduce_s(n: int, gradient_bytes: float, link: Link, k: int = 1) -> float:
    """k messages of a ring all-reduce of S bytes over n ranks: k·2(n−1)·α + 2(n−1)/n·S/B."""
    if n < 2:
        return 0.0
    return k * 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * gradient_bytes / link.bandwidth


def expected_max_of_normals(n: int) -> float:
    """E[max of n independent standard normals]: the slowest rank's expected lead, in σ (1/√π for 2; √(2 ln n)
    only bounds it, by 2.1× at n = 2). ∫ x·n·φ(x)·Φ(x)^(n−1) dx, by the midpoint rule over ±10 σ."""
    if n < 2:
        return 0.0
    h = 1e-3
    xs = (-10 + (i + 0.5) * h for i in range(int(20 / h)))
    return sum(x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
               * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (n - 1) for x in xs) * h


def predict_step_s(n: int, one: OneRank, gradient_bytes: int, link: Link, slowdown: float = 1.0) -> Dict[str, float]:
    """The predicted step of one of ``n`` ranks, by part (``slowdown``: s(n), the machine's contention term)."""
    k = buckets(gradient_bytes)
    comm = ring_allreduce_s(n, gradient_bytes, link, k)
    hidden = one.backward * slowdown * (k - 1) / k  # backward still running while the earlier buckets reduce
    exposed = max(comm / k, comm - hidden) if n > 1 else 0.0
    wait = one.sigma * slowdown * expected_max_of_normals(n)
    return {"compute": one.step * slowdown, "comm": exposed, "wait": wait,
            "total": one.step * slowdown + exposed + wait}


def predict(n: int, one: OneRank, gradient_bytes: int, link: Link, slowdown: float = 1.0) -> Dict[str, float]:
    """Images/sec of ``n`` ranks and the efficiency against n times one rank."""
    step = predict_step_s(n, one, gradient_bytes, link, slowdown)["total"]
    rate = n * one.batch / step
    return {"images_per_sec": rate, "efficiency": rate / (n * one.batch / one.step)}


def fit_link(sizes: Sequence[int], seconds: Sequence[float], n: int = 2) -> Link:
    """α and B from all-reduce times of n ranks: least squares of t = 2(n−1)·α + 2(n−1)/n·S/B."""
    mean_s, mean_t = statistics.mean(sizes), statistics.mean(seconds)
    slope = (sum((s - mean_s) * (t - mean_t) for s, t in zip(sizes, seconds))
             / sum((s - mean_s) ** 2 for s in sizes))
    intercept = max(mean_t - slope * mean_s, 0.0)
    return Link(alpha=intercept / (2 * (n - 1)), bandwidth=2 * (n - 1) / n / slope)


# --- the measurements (this machine) -------------------------------------------------------------------------

SWEEP = """
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
for size in map(int, sys.argv[1:]):
    x = torch.zeros(size // 4)
    for _ in range(3):
        dist.all_reduce(x)
    times = []
    for _ in range(15):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(size, sorted(times)[len(times) // 2], flush=True)
dist.destroy_process_group()
"""
SWEEP_BYTES = (4 * 2 ** 10, 64 * 2 ** 10, 2 ** 20, 4 * 2 ** 20, 16 * 2 ** 20)


def measure_link() -> Link:
    """The all-reduce sweep over 2 gloo processes on 127.0.0.1, one thread each: median time per size."""
    out = launch.outputs(launch.python_ranks(SWEEP, SWEEP_BYTES, 2, gloo=True))[0]
    pairs = [line.split() for line in out.splitlines() if line.strip()]
    return fit_link([int(s) for s, _ in pairs], [float(t) for _, t in pairs])


def contention(network: str, batch: int, processes: int, seconds: float = 4.0) -> float:
    """s(n) from one pair: how much slower each of ``processes`` independent one-thread bare loops runs than one
    alone, each loop its own fresh process either way. (Timing "one alone" inside this long-lived process instead
    swung s(2) from 0.98 to 1.39 between runs.)"""
    from benchmarks.speed import concurrent_bare_loops

    alone = concurrent_bare_loops(network, batch, seconds, 1)
    return processes * alone / concurrent_bare_loops(network, batch, seconds, processes)


def train_run(devices: int, network: str, batch: int, subset: int, epochs: int) -> dict:
    """train.py with ``devices`` CPU ranks of one thread each; its steady epochs (2..) from metrics.csv."""
    from callbacks.run_record import FILE_NAME, read_rows, run_dirs

    strategy = ["--strategy", "ddp"] if devices > 1 else []
    rows = launch.train_record([*strategy, "--devices", str(devices), "--accelerator", "cpu", "--network", network,
                                "--batch_size", str(batch), "--data.train_subset", str(subset), "--epochs",
                                str(epochs), "--trainer.limit_val_batches", "1", "--test_after_fit", "false",
                                "--lr_scaling", "none"],  # speed only: no larger lr to trip the guard
                               1800, threads=1, read=lambda runs: read_rows(run_dirs(runs)[-1] / FILE_NAME))
    epochs_rows: Dict[int, Dict[str, float]] = {}
    for row in rows:
        if row.get("epoch") not in (None, ""):
            values = epochs_rows.setdefault(int(float(row["epoch"])), {})
            values.update({k: float(v) for k, v in row.items() if v not in (None, "")})
    steady = [v for e, v in sorted(epochs_rows.items()) if e >= 1 and "throughput/images_per_sec" in v]
    steps = subset // (batch * devices)
    parts = {p: statistics.mean(v.get(f"time/{p}/rank0", 0.0) for v in steady) / steps for p in BUSY}
    return {"images_per_sec": statistics.median(v["throughput/images_per_sec"] for v in steady), "parts": parts,
            "sigma": statistics.mean(v.get("time/step_std_s/rank0", 0.0) for v in steady)}


def gradient_bytes_of(network: str) -> int:
    from benchmarks.speed import named_class

    net = named_class("--model.network", network)()
    return sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)


def measure(args) -> None:
    from benchmarks.speed import machine

    print(f"experiments.scaling: {args.network}, batch {args.batch_size} per rank, {args.train_subset} images, "
          f"{args.epochs} epochs, {args.runs} runs per device count; {machine()}", flush=True)
    link = measure_link()
    print(f"all-reduce sweep (2 gloo processes): alpha {link.alpha * 1e6:.0f} us, bandwidth "
          f"{link.bandwidth / 1e9:.2f} GB/s", flush=True)
    measured: Dict[int, List[dict]] = {n: [] for n in args.measure}
    pairs: List[float] = []  # s(2), one pair of bare-loop runs per round: the machine's contention drifts over minutes
    for _ in range(args.runs):  # interleaved: a slow spell of the machine falls on every device count and on s(2)
        pairs.append(contention(args.network, args.batch_size, 2))
        print(f"  contention s(2): {pairs[-1]:.3f}", flush=True)
        for n in args.measure:
            if n > max(args.measure[:2]) and len(measured[n]) >= args.runs_beyond:
                continue
            measured[n].append(train_run(n, args.network, args.batch_size, args.train_subset, args.epochs))
            print(f"  {n} rank(s): {measured[n][-1]['images_per_sec']:.0f} images/sec", flush=True)
    slow = {2: statistics.median(pairs)}
    print(f"contention s(2) = {slow[2]:.3f}, median of {len(pairs)} (range {min(pairs):.3f}-{max(pairs):.3f}; 2 "
          f"independent one-thread loops against one)", flush=True)
    ones = measured[1]
    one = OneRank(args.batch_size, *(statistics.median(r["parts"][p] for r in ones) for p in BUSY),
                  sigma=statistics.median(r["sigma"] for r in ones))
    grad = gradient_bytes_of(args.network)
    cores = len(os.sched_getaffinity(0))
    rows = []
    for n in DEVICES:
        # On this machine: s(n) for n ranks over the cores, each core time-shared by n/cores ranks beyond them
        here = slow[2] * max(1.0, n / cores) if n > 1 else 1.0
        on_machine = predict(n, one, grad, link, here)
        one_device_each = predict(n, one, grad, link, 1.0)
        got = measured.get(n, [])
        rate = statistics.median(r["images_per_sec"] for r in got) if got else None
        # Checked after the fact, never fed back: rank 0's own parts per step in the n-rank runs against one rank's
        busy = statistics.median(sum(r["parts"][p] for p in BUSY) for r in got) if got else None
        rows.append({"devices": n, "predicted_here": round(on_machine["images_per_sec"], 1),
                     "measured_here": round(rate, 1) if rate else "",
                     "runs": len(got), "error": f"{on_machine['images_per_sec'] / rate - 1:+.1%}" if rate else "",
                     "efficiency_here": round(on_machine["efficiency"], 3),
                     "predicted_device_each": round(one_device_each["images_per_sec"], 1),
                     "efficiency_device_each": round(one_device_each["efficiency"], 3),
                     "slowdown_predicted": round(here, 3),
                     "slowdown_measured": round(busy / one.step, 3) if busy else ""})
    print(f"\none rank per step: {asdict(one)}; gradient bytes {grad}, buckets {buckets(grad)}\n")
    print(markdown_table(["devices", "predicted here", "measured here (median)", "error", "s(n) predicted",
                          "rank 0's own step, measured / one rank's", "predicted, one device each", "efficiency"],
                         [[str(r["devices"]), f"{r['predicted_here']:.0f}", str(r["measured_here"]), r["error"],
                           f"{r['slowdown_predicted']:.2f}", str(r["slowdown_measured"]),
                           f"{r['predicted_device_each']:.0f}", f"{r['efficiency_device_each']:.1%}"] for r in rows]))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "scaling.csv", list(rows[0]), [list(r.values()) for r in rows])
    plot(rows, out / "scaling.png", f"{args.network}, batch {args.batch_size} per rank, CPU ranks of one thread")


def plot(rows: List[dict], path: Path, title: str) -> None:
    fig, (ax,) = figure(1, 6, 4)
    n = [r["devices"] for r in rows]
    ax.plot(n, [r["predicted_here"] for r in rows], "o-", label="predicted, this machine (2 cores)")
    ax.plot(n, [r["predicted_device_each"] for r in rows], "s--", label="predicted, one device per rank")
    got = [(r["devices"], r["measured_here"]) for r in rows if r["measured_here"] != ""]
    ax.plot([d for d, _ in got], [m for _, m in got], "kx", markersize=10, label="measured (median)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("images/sec")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def workshop() -> None:
    """The workshop's question on paper: wrn, batch 128 per GPU, 622 images/sec on one GPU, 4 GPUs."""
    grad = gradient_bytes_of("wrn")
    step = 128 / 622
    print(f"wrn: {grad / 1e6:.1f} MB of fp32 gradients, {buckets(grad)} DDP buckets; one GPU: {step * 1e3:.0f} ms "
          f"per step of 128 images (622 images/sec)")
    rows = []
    for name, bandwidth in LINKS:
        link = Link(alpha=10e-6, bandwidth=bandwidth * 1e9)  # NCCL's latency per step of a ring: ~10 us
        one = OneRank(128, 0.0, step / 3, step * 2 / 3, 0.0, 0.0, 0.0)  # backward ~ 2/3 of a step
        comm = ring_allreduce_s(4, grad, link, buckets(grad))
        parts = predict_step_s(4, one, grad, link)
        rate = predict(4, one, grad, link)
        rows.append([name, f"{bandwidth:g}", f"{comm * 1e3:.1f}", f"{parts['comm'] * 1e3:.1f}",
                     f"{rate['images_per_sec']:.0f}", f"{rate['efficiency']:.1%}", f"{step / (step + comm):.1%}"])
    print(markdown_table(["link (figure, source)", "B (GB/s)", "all-reduce of 4 GPUs (ms)", "exposed (ms)",
                          "4-GPU images/sec", "efficiency", "if nothing were hidden"], rows))


# (name, bytes per second one way, in GB/s): spec figures, a ring all-reduce moves data both ways at once
LINKS = (("PCIe 3.0 x16, 15.75 GB/s per direction (PCI-SIG: 8 GT/s x 16 lanes, 128b/130b)", 15.75),
         ("PCIe 3.0 x16 at half its spec (shared switch, host bounce)", 7.9),
         ("PCIe 4.0 x16, 31.5 GB/s per direction (PCI-SIG: 16 GT/s)", 31.5),
         ("NVLink 2.0 on V100, 150 GB/s per direction (NVIDIA V100 datasheet: 300 GB/s total)", 150.0))


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m experiments.scaling", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--network", default="cnn")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--train_subset", type=int, default=8192, help="training images per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="the first is warm-up; 2.. are measured")
    parser.add_argument("--runs", type=int, default=5, help="runs of 1 and 2 ranks (medians)")
    parser.add_argument("--runs_beyond", type=int, default=3, help="runs of the device counts beyond 2")
    parser.add_argument("--measure", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--out_dir", default=str(REPO / "docs" / "figures"))
    parser.add_argument("--workshop", action="store_true", help="the DLI workshop's 4 GPUs on paper, then exit")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.workshop:
        workshop()
        return 0
    started = time.perf_counter()
    measure(args)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
