"""Gradient noise (Neelakantan et al.): the variance schedule, its generator, and ddp replicas that stay identical."""

import json
import math

import pytest
import torch

from lightning_modules.optim import add_gradient_noise, grad_noise_seed, grad_noise_variance


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


def _noised(step, seed=0, stream=0):
    params = [torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    params[0].grad, params[1].grad = torch.ones(5), torch.ones(3)  # the third has no gradient
    add_gradient_noise(params, step=step, eta=0.01, seed=seed, stream=stream)
    return torch.cat([params[0].grad, params[1].grad]), params[2].grad


def test_noise_depends_only_on_seed_step_and_stream():
    first, untouched = _noised(step=3)
    assert untouched is None
    assert torch.equal(first, _noised(step=3)[0])  # what every ddp rank computes for this step
    for other in (_noised(step=4), _noised(step=3, seed=1), _noised(step=3, stream=1)):
        assert not torch.equal(first, other[0])
    assert len({grad_noise_seed(s, t) for s in range(20) for t in range(20)}) == 400


DDP2 = ("--strategy", "ddp", "--devices", "2")
MOMENTUM = ("--optimizer", "sgd", "--lr", "0.05", "--model.base_batch_size", "32")  # as tests/test_equivalence.py
NOISE = ("--model.grad_noise_eta", "0.01", "--trainer.callbacks+=tests.recorder.RankWeights")


@pytest.mark.multiprocess
def test_ddp_replicas_stay_identical_with_gradient_noise_added_after_the_all_reduce(strategy_runs):
    noisy = strategy_runs.get(*DDP2, "--batch_size", "16", *MOMENTUM, *NOISE)
    record = noisy.cwd / "record"
    # The hook sees gradients that are already the same on both ranks: it runs after ddp's all-reduce.
    for rank in (0, 1):
        assert json.loads((record / f"rank_grads{rank}.json").read_text()) == [True] * 8
    rank0, rank1 = (torch.load(record / f"rank_weights{r}.pt", weights_only=True) for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # bit-identical replicas
    # The noise did something, and it is the noise one process adds at the effective batch.
    assert noisy.distance(strategy_runs.get(*DDP2, "--batch_size", "16", *MOMENTUM)) > 1e-3
    one = strategy_runs.get("--devices", "1", "--batch_size", "32", *MOMENTUM, "--model.grad_noise_eta", "0.01")
    assert noisy.distance(one) < 1e-5
