"""Optimizers by name, the learning-rate scaling rule, warm-up and schedules, and gradient noise: the numbers users
fight with, as pure functions tests can pin down (README, "Batch size and learning rate")."""

import hashlib
import math
from typing import Dict, Iterable, List, Literal, Optional

import torch
from torch import nn

from lightning_modules.networks import NORM_LAYERS
from strategies.fsdp import local_shard

OptimizerName = Literal["sgd", "adamw", "novograd", "lamb", "lars"]
ScalingRule = Literal["none", "linear", "sqrt"]
ScheduleName = Literal["constant", "cosine", "step"]


def scale_lr(base_lr: float, base_batch_size: int, effective_batch: int, rule: ScalingRule) -> float:
    """Learning rate for ``effective_batch`` from one known at ``base_batch_size``: ``linear`` (Goyal et al.: the update
    per image stays constant for SGD), ``sqrt`` (its variance stays constant), ``none``."""
    ratio = effective_batch / base_batch_size
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    raise ValueError(f"unknown lr_scaling {rule!r}; choose one of: none, linear, sqrt")


def lr_factor(
    step: int,
    *,
    warmup_steps: int,
    warmup_start_factor: float,
    total_steps: int,
    schedule: ScheduleName = "constant",
    step_size: int = 1,
    gamma: float = 0.1,
) -> float:
    """Multiplier of the scaled learning rate at optimizer step ``step`` (0-based): a linear warm-up from
    ``warmup_start_factor`` to 1 over ``warmup_steps``, then the schedule counted from its end."""
    if step < warmup_steps:
        return warmup_start_factor + (1.0 - warmup_start_factor) * step / warmup_steps
    after = step - warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(after, span) / span))
    if schedule == "step":
        return gamma ** (after // max(1, step_size))
    raise ValueError(f"unknown schedule {schedule!r}; choose one of: constant, cosine, step")


def param_groups(model: nn.Module, weight_decay: float, lr: Optional[float] = None,
                 bias_lr_scale: float = 1.0) -> List[Dict]:
    """Weight decay skips biases and norm weights, decided by role, not shape (under FSDP every parameter is a flat
    1-D shard); LARS also leaves those groups out of its trust ratio, as the papers do. ``bias_lr_scale`` != 1 gives
    that group lr × scale (airbench trains biases faster: they are few and their gradients small)."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad:
                (no_decay if name == "bias" or isinstance(module, NORM_LAYERS) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
        if bias_lr_scale != 1.0:
            if lr is None:
                raise ValueError("param_groups: bias_lr_scale needs the lr it scales")
            groups[-1]["lr"] = lr * bias_lr_scale
    return groups


def build_optimizer(
    name: OptimizerName,
    params: Iterable,
    lr: float,
    momentum: float = 0.0,
    nesterov: bool = False,
) -> torch.optim.Optimizer:
    """Optimizer by its config name; weight decay comes per group from :func:`param_groups`.

    NovoGrad uses ``grad_averaging=True`` as the DLI workshop did; LAMB, LARS and
    NovoGrad come from torch-optimizer (core PyTorch has none of them).
    """
    if name == "sgd":
        if nesterov and momentum <= 0:
            raise ValueError("nesterov=true needs momentum > 0 (e.g. --model.momentum 0.9)")
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    import torch_optimizer  # imported only when asked for: it is slow to import and rarely used

    if name == "novograd":
        return torch_optimizer.NovoGrad(params, lr=lr, grad_averaging=True)
    if name == "lamb":
        return torch_optimizer.Lamb(params, lr=lr)
    if name == "lars":
        return torch_optimizer.LARS(params, lr=lr, momentum=momentum, nesterov=nesterov)
    raise ValueError(f"unknown optimizer {name!r}; choose one of: sgd, adamw, novograd, lamb, lars")


def grad_noise_variance(step: int, eta: float, gamma: float = 0.55) -> float:
    """Variance of the gradient noise at optimizer step ``step`` (0-based): η / (1 + t)^γ (Neelakantan et al.)."""
    return eta / (1.0 + step) ** gamma


def grad_noise_seed(seed: int, step: int, stream: int = 0) -> int:
    """A 32-bit seed for one step, the same on every rank: torch's CPU generator keeps only 32 bits, so (seed, stream,
    step) are hashed; ``stream`` separates fsdp shards."""
    digest = hashlib.blake2b(f"grad-noise:{seed}:{stream}:{step}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@torch.no_grad()
def add_gradient_noise(
    params: Iterable[torch.nn.Parameter], step: int, eta: float, gamma: float = 0.55, seed: int = 0, stream: int = 0
) -> float:
    """Add N(0, η/(1+t)^γ) to every gradient, drawn from a generator seeded by step: called after ddp's all-reduce,
    every rank adds the same noise and the replicas stay identical. Returns the standard deviation."""
    std = math.sqrt(grad_noise_variance(step, eta, gamma))
    generators: Dict[torch.device, torch.Generator] = {}
    for param in params:
        grad: Optional[torch.Tensor] = None if param.grad is None else local_shard(param.grad)  # fsdp: this rank's
        if grad is None or grad.numel() == 0:
            continue
        generator = generators.get(grad.device)
        if generator is None:
            generator = generators[grad.device] = torch.Generator(device=grad.device)
            generator.manual_seed(grad_noise_seed(seed, step, stream))
        grad.add_(torch.randn(grad.shape, generator=generator, device=grad.device, dtype=grad.dtype), alpha=std)
    return std
