"""Trials of the CPU record on held-out images (docs/benchmarks.md, "The 94 % CPU record"): kept in the commit their
figures name, removed after if they lose. Each is a staged_cnn variant a config names by class path."""

import torch
from torch import nn

from lightning_modules.networks import StagedCNN

STAGES = ((16, 1), (32, 2), (64, 2), (128, 2))


class StagedCutout(StagedCNN):
    """staged_cnn that, in training, blanks one ``size``×``size`` square per image (with probability ``p``) to the
    background's value, its centre anywhere on the image (cutout, DeVries & Taylor 2017; random erasing's square)."""

    def __init__(self, num_classes: int = 10, stages=STAGES, size: int = 8, p: float = 0.5):
        super().__init__(num_classes, stages)
        self.size, self.p = size, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.p > 0:
            n, _, h, w = x.shape
            cy = torch.randint(0, h, (n, 1, 1, 1), device=x.device)
            cx = torch.randint(0, w, (n, 1, 1, 1), device=x.device)
            rows = torch.arange(h, device=x.device).view(1, 1, h, 1)
            cols = torch.arange(w, device=x.device).view(1, 1, 1, w)
            top, left = cy - self.size // 2, cx - self.size // 2
            inside = (rows >= top) & (rows < top + self.size) & (cols >= left) & (cols < left + self.size)
            inside &= (torch.rand(n, 1, 1, 1, device=x.device) < self.p)
            x = torch.where(inside, x.amin(), x)
        return super().forward(x)


class StagedActivation(StagedCNN):
    """staged_cnn with ``activation`` (an ``nn`` class name: SiLU, GELU, ...) in place of every ReLU."""

    def __init__(self, num_classes: int = 10, stages=STAGES, activation: str = "SiLU"):
        super().__init__(num_classes, stages)
        for parent in list(self.modules()):
            for name, child in parent.named_children():
                if isinstance(child, nn.ReLU):
                    setattr(parent, name, getattr(nn, activation)())


class StagedKaiming(StagedCNN):
    """staged_cnn whose convolutions start from He's normal init (fan_out, ReLU), torchvision ResNet's, not
    PyTorch's default uniform (a=√5, a third of its variance)."""

    def __init__(self, num_classes: int = 10, stages=STAGES, mode: str = "fan_out"):
        super().__init__(num_classes, stages)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode=mode, nonlinearity="relu")


class StagedAvgMax(StagedCNN):
    """staged_cnn whose head reads the last map's max and mean, concatenated (twice the head's inputs)."""

    def __init__(self, num_classes: int = 10, stages=STAGES):
        super().__init__(num_classes, stages)
        width = self[-1].in_features
        body = list(self.children())[:-3]
        for index in range(len(self) - 1, -1, -1):
            del self[index]
        for index, module in enumerate(body):
            self.add_module(str(index), module)
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, module in self.named_children():
            if name != "head":
                x = module(x)
        return self.head(torch.cat([x.amax((2, 3)), x.mean((2, 3))], 1))


class LookaheadAdamW(torch.optim.AdamW):
    """AdamW inside Lookahead (Zhang et al. 2019; airbench's weight averaging): every ``k`` steps the slow weights
    move ``alpha`` of the way to the fast ones and the fast weights restart from them."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 1e-2, k: int = 5, alpha: float = 0.5, **kw):
        super().__init__(params, lr=lr, weight_decay=weight_decay, **kw)
        self.k, self.alpha, self.steps, self.slow = k, alpha, 0, None

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        params = [p for group in self.param_groups for p in group["params"]]
        if self.slow is None:
            self.slow = [p.detach().clone() for p in params]
        self.steps += 1
        if self.steps % self.k == 0:
            for slow, fast in zip(self.slow, params):
                slow.add_(fast - slow, alpha=self.alpha)
                fast.copy_(slow)
        return loss
