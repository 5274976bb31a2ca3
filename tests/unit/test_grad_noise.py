"""Gradient noise (Neelakantan et al.): the variance schedule, its generator, and ddp replicas that stay identical."""

import math

import pytest
import torch

from lightning_modules.optim import (
    add_gradient_noise,
    grad_noise_seed,
    grad_noise_variance,
)


def _noised(step, seed=0, stream=0):
    params = [torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    params[0].grad, params[1].grad = torch.ones(5), torch.ones(3)  # the third has no gradient
    add_gradient_noise(params, step=step, eta=0.01, seed=seed, stream=stream)
    return torch.cat([params[0].grad, params[1].grad]), params[2].grad


def test_variance_schedule_is_eta_over_one_plus_t_to_the_gamma():
    assert grad_noise_variance(0, 0.3) == pytest.approx(0.3)  # t = 0: the first optimizer step gets eta itself
    assert grad_noise_variance(9, 0.3, 0.55) == pytest.approx(0.3 / 10 ** 0.55)
    assert grad_noise_variance(99, 1.0, 0.55) == pytest.approx(100 ** -0.55)
    assert grad_noise_variance(5, 0.0) == 0.0


@pytest.mark.parametrize("step", [0, 9])
def test_added_noise_has_the_scheduled_variance_and_zero_mean(step):
    params = [torch.nn.Parameter(torch.zeros(300, 1000))]
    params[0].grad = torch.zeros(300, 1000)
    std = add_gradient_noise(params, step=step, eta=0.3, gamma=0.55, seed=1)
    assert std == pytest.approx(math.sqrt(grad_noise_variance(step, 0.3, 0.55)))
    noise = params[0].grad
    assert noise.var().item() == pytest.approx(grad_noise_variance(step, 0.3, 0.55), rel=0.02)
    assert abs(noise.mean().item()) < 5 * std / math.sqrt(noise.numel())


def test_noise_depends_only_on_seed_step_and_stream():
    first, untouched = _noised(step=3)
    assert untouched is None
    assert torch.equal(first, _noised(step=3)[0])  # what every ddp rank computes for this step
    for other in (_noised(step=4), _noised(step=3, seed=1), _noised(step=3, stream=1)):
        assert not torch.equal(first, other[0])
    assert len({grad_noise_seed(s, t) for s in range(20) for t in range(20)}) == 400




def test_the_callback_adds_the_noise_of_the_step_after_backward_and_logs_its_std(fashion_root, tmp_path):
    """With eta so large the noise dwarfs the gradients, the weights after one step differ from plain SGD's by the
    noise the schedule predicts (momentum off: one step moves a weight by lr × (gradient + noise))."""
    from lightning.pytorch import seed_everything

    from callbacks import GradientNoise
    from tests.unit.conftest import tiny_fit

    runs = {}
    for name, callbacks in (("plain", []), ("noise", [GradientNoise(eta=100.0)])):
        seed_everything(3)
        trainer = tiny_fit(fashion_root, tmp_path / name, callbacks, limit_train_batches=1, limit_val_batches=0,
                           model_args=dict(momentum=0.0, weight_decay=0.0))
        runs[name] = (torch.cat([p.detach().flatten() for p in trainer.lightning_module.parameters()]), trainer)
    difference = (runs["noise"][0] - runs["plain"][0]) / 0.05  # lr 0.05
    assert difference.std().item() == pytest.approx(math.sqrt(grad_noise_variance(0, 100.0)), rel=0.05)
    assert runs["noise"][1].callback_metrics["train/grad_noise_std"].item() == pytest.approx(10.0)
