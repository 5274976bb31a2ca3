"""Experiment 1 (experiments/sandbox.py): N gloo processes at B/N step like one process at B; f²/N update variance."""


import pytest
import torch

from experiments.sandbox import SandboxConfig, gradient_variance, run


@pytest.mark.parametrize("scaling, expected", [("none", 1 / 4), ("linear", 4), ("sqrt", 1)])
def test_update_variance_ratio_is_f_squared_over_n(scaling, expected):
    """Vectorised, one process: run 2 (batch B) stands for ddp, as tests/test_sandbox.py shows it takes the same steps."""
    cfg = SandboxConfig(batch_size=64, world_size=4, lr=1e-3, lr_scaling=scaling, noise=0.1, n_experiments=20000,
                        steps=2, seed=1)
    baseline, large = run(cfg, distributed=False)
    assert large.update_variance / baseline.update_variance == pytest.approx(expected, rel=0.15)
    for result in (baseline, large):  # and each matches lr²·Var(g)/b
        assert result.update_variance == pytest.approx(result.theory(cfg.noise), rel=0.05)


def test_per_sample_gradient_variance_formula_against_sampling():
    generator = torch.Generator().manual_seed(0)
    x = 1 + 0.3 * torch.randn(2_000_000, generator=generator, dtype=torch.float64)
    y = 0.3 * torch.randn(2_000_000, generator=generator, dtype=torch.float64)
    w = 0.7
    assert (2 * x * (w * x - y)).var().item() == pytest.approx(gradient_variance(w, 0.3), rel=0.01)


