"""Ghost Batch Normalization (Hoffer et al., 2017): in training, each batch-norm normalises consecutive sub-batches
of ``ghost_batch_size`` samples with their own statistics, bringing back a small batch's normalisation noise at any
batch. Running statistics get one update per step (the sub-batches' mean); evaluation, parameters and state_dict
keys are plain batch-norm's, so checkpoints load either way. A batch that g does not divide is cut into B // g
nearly equal parts (none smaller than g)."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


class _GhostBatchNorm:
    """Mixed into ``nn.BatchNorm1d/2d/3d``: the ghost-batch forward in training mode."""

    ghost_batch_size: Optional[int] = None
    ghost_batches: Optional[int] = None  # instead of a size: this many equal parts (virtual devices' shards)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (torch's name)
        self._check_input_dim(input)
        g, parts = self.ghost_batch_size, self.ghost_batches
        if parts is None and g is not None and input.shape[0] > g:
            parts = input.shape[0] // g
        if not self.training or parts is None or parts <= 1:
            return super().forward(input)  # eval, off, or one ghost batch: plain batch-norm
        if input.shape[0] % parts == 0:
            return self._equal_shards(input, parts)
        chunks = torch.tensor_split(input, parts)
        out = torch.cat(
            [F.batch_norm(c, None, None, self.weight, self.bias, training=True, eps=self.eps) for c in chunks]
        )
        if self.track_running_stats:
            dims = [0] + list(range(2, input.dim()))  # every dimension but the channels
            with torch.no_grad():
                stats = [torch.var_mean(c.float(), dim=dims, correction=1) for c in chunks]
            sizes = [len(c) / len(input) for c in chunks]  # host numbers: no copy to the device
            self._track(sum(w * m for w, (_, m) in zip(sizes, stats)), sum(w * v for w, (v, _) in zip(sizes, stats)))
        return out

    def _equal_shards(self, input: torch.Tensor, parts: int) -> torch.Tensor:
        """Batch-norm of each of ``parts`` equal shards in one call, the shards' channels side by side as channels of
        their own: torch's batch-norm kernel, as each rank runs it, in one pass however many shards (a loop over 64
        virtual devices' shards ran fast_cnn 2x slower)."""
        n, rest = input.shape[0] // parts, input.shape[1:]
        channels_last = input.dim() == 4 and input.is_contiguous(memory_format=torch.channels_last)
        side_by_side = input.reshape(parts, n, *rest).transpose(0, 1).reshape(n, parts * rest[0], *rest[1:])
        weight = self.weight.repeat(parts) if self.affine else None
        bias = self.bias.repeat(parts) if self.affine else None
        out = F.batch_norm(side_by_side, None, None, weight, bias, training=True, eps=self.eps)
        out = out.reshape(n, parts, *rest).transpose(0, 1).reshape(input.shape)
        if self.track_running_stats:
            dims = [0] + list(range(2, side_by_side.dim()))
            with torch.no_grad():
                var, mean = torch.var_mean(side_by_side.float(), dim=dims, correction=1)
                self._track(mean.reshape(parts, -1).mean(0), var.reshape(parts, -1).mean(0))
        return out.contiguous(memory_format=torch.channels_last) if channels_last else out

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Running statistics: one update per forward, from the shards' mean statistics (unbiased variances)."""
        self.num_batches_tracked.add_(1)
        factor = (1.0 / self.num_batches_tracked.float()) if self.momentum is None else self.momentum
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(var.to(self.running_var.dtype), factor)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ghost_batch_size={self.ghost_batch_size}"


class GhostBatchNorm1d(_GhostBatchNorm, nn.BatchNorm1d):
    pass


class GhostBatchNorm2d(_GhostBatchNorm, nn.BatchNorm2d):
    pass


class GhostBatchNorm3d(_GhostBatchNorm, nn.BatchNorm3d):
    pass


def is_ghost(module: nn.Module) -> bool:
    """Whether ``module`` is a batch-norm that :func:`use_ghost_batch_norm` put in."""
    return isinstance(module, _GhostBatchNorm)


_GHOST = {nn.BatchNorm1d: GhostBatchNorm1d, nn.BatchNorm2d: GhostBatchNorm2d, nn.BatchNorm3d: GhostBatchNorm3d}


def use_ghost_batch_norm(module: nn.Module, ghost_batch_size: Optional[int] = None,
                         ghost_batches: Optional[int] = None) -> nn.Module:
    """Replace every ``nn.BatchNorm1d/2d/3d`` inside ``module`` by its ghost version, in place; returns ``module``.
    Weights, running statistics, momentum, eps and training mode are kept; a network without batch-norm (``mlp``) is
    returned unchanged."""
    given = [value for value in (ghost_batch_size, ghost_batches) if value is not None]
    if len(given) != 1 or given[0] < 1:
        raise ValueError(f"give one of ghost_batch_size and ghost_batches, >= 1: {ghost_batch_size}, {ghost_batches}")
    for name, child in module.named_children():
        ghost_class = _GHOST.get(type(child))
        if ghost_class is None:
            if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, _GhostBatchNorm):
                raise TypeError(f"{type(child).__name__} at {name!r} has no ghost version")
            use_ghost_batch_norm(child, ghost_batch_size, ghost_batches)
            continue
        like = next((t for t in (*child.parameters(), *child.buffers()) if t.is_floating_point()), None)
        ghost = ghost_class(child.num_features, eps=child.eps, momentum=child.momentum, affine=child.affine,
                            track_running_stats=child.track_running_stats,
                            **({"device": like.device, "dtype": like.dtype} if like is not None else {}))
        ghost.ghost_batch_size, ghost.ghost_batches = ghost_batch_size, ghost_batches
        ghost.load_state_dict(child.state_dict())
        ghost.train(child.training)
        setattr(module, name, ghost)
    return module
