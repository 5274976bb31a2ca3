"""Experiment 1 (experiments/sandbox.py): N gloo processes at B/N step like one process at B; f²/N update variance."""

import subprocess
import sys

import pytest

from experiments.sandbox import SandboxConfig, parse_args, report, run
from tests.conftest import REPO

pytestmark = pytest.mark.multiprocess  # run 3 of every experiment starts world_size gloo processes


def test_command_line_checks_and_runs_as_a_script():
    with pytest.raises(SystemExit):
        parse_args(["--batch_size", "10", "--world_size", "4"])
    assert parse_args(["--lr_scaling", "sqrt", "--world_size", "4"]).scaled_lr == pytest.approx(2e-3)
    result = subprocess.run([sys.executable, "experiments/sandbox.py", "--batch_size", "8", "--world_size", "2",
                             "--lr", "0.01", "--noise", "0", "--steps", "3"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ddp 2 x batch 4, lr 0.02, 3 step(s):" in result.stdout and "my_net.w: 0.8847" in result.stdout, \
        result.stdout


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


def test_with_noise_ddp_takes_the_same_steps_and_linear_scaling_multiplies_the_update_variance_by_n():
    cfg = SandboxConfig(batch_size=16, world_size=2, lr=1e-3, lr_scaling="linear", noise=0.1, n_experiments=4000,
                        steps=3)
    baseline, large, ddp = run(cfg)
    assert (ddp.trajectory - large.trajectory).abs().max() < 1e-6  # every experiment, every step
    assert ddp.update_variance / baseline.update_variance == pytest.approx(2, rel=0.15)
