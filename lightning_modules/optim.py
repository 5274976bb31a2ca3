"""The optimizer's side, as pure functions tests can pin down: the weight-decay groups, gradient noise, and the check
that an optimizer given by class path can run (the learning rate's rule, warm-up and schedule: lr_policy.py)."""

import hashlib
import inspect
import math
import sys
from typing import Callable, Dict, Iterable, List, Optional

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from lightning_modules.networks import NORM_LAYERS

def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this rank holds: its shard of a DTensor (FSDP2), else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def param_groups(model: nn.Module) -> List[Dict]:
    """The weights, which take the optimizer's own ``weight_decay``, then the biases and norm weights, which take none.
    Decided by role, not shape (under FSDP every parameter is a flat 1-D shard); LARS also leaves the second group
    out of its trust ratio, as the papers do."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad:
                (no_decay if name == "bias" or isinstance(module, NORM_LAYERS) else decay).append(param)
    return [{"params": decay}] + ([{"params": no_decay, "weight_decay": 0.0}] if no_decay else [])


OptimizerFactory = Callable[[Iterable], torch.optim.Optimizer]
WORKING_OPTIMIZERS = "torch.optim.SGD, torch.optim.AdamW, torch.optim.RAdam or the shorthands (docs/cli.md)"


def factory_name(factory: OptimizerFactory) -> str:
    """The class an optimizer factory builds (LightningCLI's is a partial over it), for messages."""
    cls = next((a for a in (getattr(factory, "func", None), *getattr(factory, "args", ())) if isinstance(a, type)),
               None)
    if cls is None:
        return getattr(factory, "__name__", repr(factory))
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):  # the shortest module that exports it, as configs name it: torch.optim.SGD
        module = sys.modules.get(".".join(parts[:end]))
        if getattr(module, cls.__qualname__, None) is cls:
            return f"{'.'.join(parts[:end])}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def check_optimizer(factory: OptimizerFactory) -> torch.optim.Optimizer:
    """Build the optimizer over throw-away parameters, so that a value it refuses (a negative lr, nesterov without
    momentum...), one that cannot train (a learning rate or momentum that is not finite, momentum >= 1), or an
    optimizer this module cannot drive (one that refuses the weight-decay parameter groups, or whose ``step`` needs
    a closure: one forward and backward per step is the data-parallel step) fails at start-up in one line, whatever
    the optimizer. Returns that optimizer; raises ValueError."""
    try:
        optimizer = factory([nn.Parameter(torch.zeros(1))])
    except Exception as error:  # whatever the user's constructor raises: one line naming it
        raise ValueError(f"model.optimizer {factory_name(factory)} cannot be built: {type(error).__name__}: "
                         f"{' '.join(str(error).split())}") from error
    name = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
    try:
        factory([{"params": [nn.Parameter(torch.zeros(1))]}, {"params": [nn.Parameter(torch.zeros(1))],
                                                              "weight_decay": 0.0}])
    except (ValueError, TypeError, RuntimeError) as error:
        raise ValueError(f"model.optimizer {name} refuses parameter groups ({' '.join(str(error).split())}), which "
                         f"the classifier needs (no weight decay on biases and norm weights): use one that takes "
                         f"them, e.g. {WORKING_OPTIMIZERS}") from error
    closure = inspect.signature(optimizer.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise ValueError(f"model.optimizer {name} needs a closure in every step (it evaluates the loss several "
                         f"times), but a data-parallel step here is one forward and one backward: use one that "
                         f"steps without, e.g. {WORKING_OPTIMIZERS}")
    settings = optimizer.defaults
    if not isinstance(settings.get("lr"), (int, float)) or not settings["lr"] > 0:
        raise ValueError(f"model.optimizer needs a learning rate > 0 (lr), got {settings.get('lr')!r}")
    for key, value in settings.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"model.optimizer's {key} must be a finite number, got {value}")
    momentum = settings.get("momentum")
    if isinstance(momentum, (int, float)) and not 0 <= momentum < 1:
        raise ValueError(f"model.optimizer's momentum must be >= 0 and < 1 (e.g. 0.9), got {momentum}")
    return optimizer


def grad_noise_variance(step: int, eta: float, gamma: float = 0.55) -> float:
    """Variance of the gradient noise at optimizer step ``step`` (0-based): η / (1 + t)^γ (Neelakantan et al.)."""
    return eta / (1.0 + step) ** gamma


def grad_noise_seed(seed: int, step: int, stream: int = 0) -> int:
    """A 32-bit seed for one step, the same on every rank: torch's CPU generator keeps only 32 bits, so (seed, stream,
    step) are hashed; ``stream`` separates fsdp shards."""
    digest = hashlib.blake2b(f"grad-noise:{seed}:{stream}:{step}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@torch.no_grad()
def add_gradient_noise(params: Iterable[torch.nn.Parameter], step: int, eta: float, gamma: float = 0.55,
                       seed: int = 0, stream: int = 0) -> float:
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
