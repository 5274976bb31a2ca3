"""Experiment 1, the DDP sandbox: one linear neuron, trained on one process and on N gloo processes.

    python -m experiments.sandbox --world_size 2 --batch_size 128 --lr 1e-3
    python -m experiments.sandbox --world_size 4 --noise 0.1 --n_experiments 10000 --lr_scaling sqrt

Runs 1 (one process, batch B/N, ``--lr``), 2 (one process, batch B, scaled lr) and 3 (N gloo processes at B/N
under DDP, scaled lr) on the same samples; the model and the theory: docs/large_batch.md, "Experiment 1".
"""

import argparse
import math
import os
import sys
import tempfile
import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import List, Literal, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

Scaling = Literal["none", "linear", "sqrt"]
DTYPE = torch.float64


@dataclass
class SandboxConfig:
    batch_size: int = 128  # B: the effective batch of runs 2 and 3
    world_size: int = 2  # N
    lr: float = 1e-3  # known to work at batch B/N on one process
    lr_scaling: Scaling = "linear"
    noise: float = 0.0  # std of the Gaussian noise on inputs and targets; 0: deterministic
    n_experiments: int = 1
    steps: int = 1  # optimizer steps at batch B (run 1 takes N times as many)
    seed: int = 0

    @property
    def per_process(self) -> int:
        return self.batch_size // self.world_size

    @property
    def scaled_lr(self) -> float:
        factor = {"none": 1.0, "linear": float(self.world_size), "sqrt": math.sqrt(self.world_size)}
        return self.lr * factor[self.lr_scaling]

    def check(self) -> None:
        if self.world_size < 1 or self.batch_size < 1 or self.batch_size % self.world_size:
            raise ValueError(f"--batch_size {self.batch_size} must be a positive multiple of --world_size "
                             f"{self.world_size}")
        if self.n_experiments < 1 or self.steps < 1 or self.noise < 0 or self.lr <= 0:
            raise ValueError("--n_experiments and --steps must be >= 1, --noise >= 0 and --lr > 0")


class Neurons(nn.Module):
    """``n`` independent single-weight neurons, y_hat[e] = w[e]·x[e], all initialised to 1."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(n, dtype=DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w[:, None] * x


def batches(cfg: SandboxConfig):
    """The global batches of B samples for every experiment, (n_experiments, B) each: the same stream in every run."""
    generator = torch.Generator().manual_seed(cfg.seed)
    shape = (cfg.n_experiments, cfg.batch_size)
    for _ in range(cfg.steps):
        if cfg.noise == 0:
            yield torch.ones(shape, dtype=DTYPE), torch.zeros(shape, dtype=DTYPE)
        else:
            x = 1 + cfg.noise * torch.randn(shape, generator=generator, dtype=DTYPE)
            y = cfg.noise * torch.randn(shape, generator=generator, dtype=DTYPE)
            yield x, y


def train(cfg: SandboxConfig, batch: int, lr: float, slices: List[int], model: Optional[nn.Module] = None,
          neurons: Optional[Neurons] = None) -> torch.Tensor:
    """Train on slices of every global batch; returns w after each step, (steps + 1, n_experiments).

    ``slices``: which B/N-wide slices of a global batch to step on, in order (all of it when batch == B).
    """
    neurons = neurons if neurons is not None else Neurons(cfg.n_experiments)
    model = model if model is not None else neurons
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trajectory = [neurons.w.detach().clone()]
    for x, y in batches(cfg):
        for r in slices:
            part = slice(r * batch, (r + 1) * batch)
            optimizer.zero_grad()
            # each experiment's MSE; the sum keeps their gradients apart
            ((model(x[:, part]) - y[:, part]) ** 2).mean(dim=1).sum().backward()
            optimizer.step()
            trajectory.append(neurons.w.detach().clone())
    return torch.stack(trajectory)


def _ddp_worker(rank: int, cfg: SandboxConfig, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=cfg.world_size,
                            timeout=timedelta(seconds=120))
    try:
        neurons = Neurons(cfg.n_experiments)
        ddp = nn.parallel.DistributedDataParallel(neurons)  # averages the gradient over ranks in backward
        trajectory = train(cfg, cfg.per_process, cfg.scaled_lr, [rank], model=ddp, neurons=neurons)
        if rank == 0:
            torch.save(trajectory, f"{folder}/trajectory.pt")
    finally:
        dist.destroy_process_group()


def train_ddp(cfg: SandboxConfig) -> torch.Tensor:
    """Run 3: N gloo processes at batch B/N each; rank 0's trajectory. On Linux the ranks are forked (they start
    in milliseconds), after importing torch._dynamo here (DDP imports it when first built: 2 s per rank)."""
    method = "fork" if sys.platform == "linux" else "spawn"
    if method == "fork":
        import torch._dynamo  # noqa: F401
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_ddp_worker, args=(cfg, folder), nprocs=cfg.world_size, join=True, start_method=method)
        return torch.load(f"{folder}/trajectory.pt", weights_only=True)


def gradient_variance(w: float, noise: float) -> float:
    """Var of one sample's gradient 2x(wx - y), x ~ N(1, s²), y ~ N(0, s²) independent."""
    s2 = noise ** 2
    return 4 * w * w * (4 * s2 + 2 * s2 * s2) + 4 * (1 + s2) * s2


@dataclass
class RunResult:
    label: str  # who ran it, at which batch per process
    trajectory: torch.Tensor  # (steps + 1, n_experiments)
    batch: int  # images behind one update (summed over ranks)
    lr: float

    @property
    def final_w(self) -> float:
        return self.trajectory[-1].mean().item()

    @property
    def update_variance(self) -> float:
        updates = self.trajectory[1:] - self.trajectory[:-1]
        return updates.var(dim=1, correction=1 if updates.shape[1] > 1 else 0).mean().item()

    def theory(self, noise: float) -> float:
        means = self.trajectory[:-1].mean(dim=1).tolist()
        return sum(self.lr ** 2 * gradient_variance(w, noise) / self.batch for w in means) / len(means)

    def line(self, noise: float) -> str:
        steps = self.trajectory.shape[0] - 1
        head = f"{self.label}, lr {self.lr:.4g}, {steps} step(s):"
        return (f"{head:<50} my_net.w: {self.final_w:.4f}   update step variance: {self.update_variance:.3g}"
                f"   (theory {self.theory(noise):.3g})")


def run(cfg: SandboxConfig, distributed: bool = True) -> List[RunResult]:
    """Runs 1, 2 and (if ``distributed``) 3 of the module docstring (docs/large_batch.md, "Experiment 1")."""
    cfg.check()
    n = cfg.world_size
    b, big = cfg.per_process, cfg.batch_size
    results = [
        RunResult(f"1 process at batch {b}", train(cfg, b, cfg.lr, list(range(n))), b, cfg.lr),
        RunResult(f"1 process at batch {big}", train(cfg, big, cfg.scaled_lr, [0]), big, cfg.scaled_lr),
    ]
    if distributed:
        results.append(RunResult(f"ddp {n} x batch {b}", train_ddp(cfg), big, cfg.scaled_lr))
    return results


def report(cfg: SandboxConfig, results: List[RunResult]) -> str:
    n = cfg.world_size
    data = "x = 1, y = 0" if cfg.noise == 0 else f"x = 1 + {cfg.noise:g}·ε, y = {cfg.noise:g}·ε"
    lines = [
        f"Single neuron, w0 = 1, {data}, MSE, SGD; {cfg.n_experiments} experiment(s), vectorised",
        f"lr {cfg.lr:g} known at batch {cfg.per_process}; {cfg.lr_scaling} scaling to batch {cfg.batch_size}: "
        f"lr {cfg.scaled_lr:.4g}",
        *(r.line(cfg.noise) for r in results),
    ]
    baseline, large = results[0], results[1]
    if len(results) > 2:
        gap = (results[2].trajectory - large.trajectory).abs().max().item()
        lines.append(f"ddp vs 1 process at batch {cfg.batch_size}: largest |w difference| over all steps = {gap:.2g}")
    if cfg.noise > 0 and cfg.n_experiments > 1:
        ratio = results[-1].update_variance / baseline.update_variance
        expected = {"none": 1 / n, "linear": n, "sqrt": 1}[cfg.lr_scaling]
        lines.append(f"update step variance, {results[-1].label} / {baseline.label}: {ratio:.3g} "
                     f"(theory f²/N = {expected:.3g} for {cfg.lr_scaling} scaling)")
    return "\n".join(lines)


def parse_args(argv: Optional[List[str]] = None) -> SandboxConfig:
    parser = argparse.ArgumentParser(prog="python -m experiments.sandbox", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    helps = {"batch_size": "B: effective batch of runs 2 and 3", "world_size": "N: gloo processes of run 3",
             "lr": "the lr known to work at batch B/N", "noise": "std of the noise on x and y; 0: deterministic",
             "steps": "optimizer steps at batch B"}
    for field in dataclasses.fields(SandboxConfig):
        kind = {"lr_scaling": dict(choices=["none", "linear", "sqrt"])}.get(field.name, dict(type=field.type))
        parser.add_argument(f"--{field.name}", default=field.default, help=helps.get(field.name), **kind)
    cfg = SandboxConfig(**vars(parser.parse_args(argv)))
    try:
        cfg.check()
    except ValueError as error:
        parser.error(str(error))
    return cfg


def main(argv: Optional[List[str]] = None) -> int:
    cfg = parse_args(argv)
    torch.set_num_threads(min(torch.get_num_threads(), os.cpu_count() or 1))
    print(report(cfg, run(cfg)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
