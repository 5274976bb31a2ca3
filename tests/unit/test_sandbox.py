"""Experiment 1 (experiments/sandbox.py): N gloo processes at B/N step like one process at B; f²/N update variance."""


import pytest
import torch

from experiments.sandbox import SandboxConfig, gradient_variance, report, run


@pytest.mark.multiprocess


@pytest.mark.multiprocess
def test_deterministic_one_process_and_n_processes_agree():
    cfg = SandboxConfig(batch_size=8, world_size=2, lr=0.01, lr_scaling="linear", steps=3)
    baseline, large, ddp = run(cfg)
    assert (ddp.trajectory - large.trajectory).abs().max() < 1e-6
    assert ddp.final_w == pytest.approx((1 - 2 * 0.02) ** 3, abs=1e-12)  # w <- w - lr·2w at x = 1, y = 0
    assert baseline.final_w == pytest.approx((1 - 2 * 0.01) ** 6, abs=1e-12)
    # Linear scaling matches the small-batch recipe only to first order in lr: (1-2lr)^2 = 1-4lr+4lr².
    assert abs(ddp.final_w - baseline.final_w) == pytest.approx(3 * 4 * 0.01 ** 2, rel=0.1)
    text = report(cfg, [baseline, large, ddp])
    assert "ddp 2 x batch 4, lr 0.02, 3 step(s):" in text and "my_net.w: 0.8847   update step variance: 0" in text


@pytest.mark.multiprocess
def test_with_noise_ddp_takes_the_same_steps_and_linear_scaling_multiplies_the_update_variance_by_n():
    cfg = SandboxConfig(batch_size=16, world_size=2, lr=1e-3, lr_scaling="linear", noise=0.1, n_experiments=4000,
                        steps=3)
    baseline, large, ddp = run(cfg)
    assert (ddp.trajectory - large.trajectory).abs().max() < 1e-6  # every experiment, every step
    assert ddp.update_variance / baseline.update_variance == pytest.approx(2, rel=0.15)


@pytest.mark.parametrize("scaling, expected", [("none", 1 / 4), ("linear", 4), ("sqrt", 1)])
def test_update_variance_ratio_is_f_squared_over_n(scaling, expected):
    """Vectorised, one process: run 2 (batch B) stands for ddp, as the tests above show it takes the same steps."""
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


