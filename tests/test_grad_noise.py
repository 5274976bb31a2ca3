"""Gradient noise (Neelakantan et al.): the variance schedule, its generator, and ddp replicas that stay identical."""

import json

import pytest
import torch

DDP2 = ("--strategy", "ddp", "--devices", "2")
MOMENTUM = ("--optimizer", "sgd", "--lr", "0.05", "--model.lr_policy.base_batch_size", "32")  # as tests/test_equivalence.py
NOISE = ("--trainer.callbacks+=callbacks.GradientNoise", "--trainer.callbacks.eta", "0.01",
         "--trainer.callbacks+=tests.recorder.RankWeights")


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
    one = strategy_runs.get("--devices", "1", "--batch_size", "32", *MOMENTUM, "--trainer.callbacks+=callbacks.GradientNoise",
                              "--trainer.callbacks.eta", "0.01")
    assert noisy.distance(one) < 1e-5
