"""The learning-rate rule, warm-up and optimizers: the numbers users otherwise derive by hand."""

import math

import pytest
import torch
from torch import nn

from lightning_modules.optim import build_optimizer, lr_factor, param_groups, scale_lr


@pytest.mark.parametrize(
    "rule, expected",
    [("none", 0.1), ("linear", 0.4), ("sqrt", 0.2)],
)
def test_scaling_rule_from_base_batch_to_effective_batch(rule, expected):
    assert scale_lr(0.1, base_batch_size=128, effective_batch=512, rule=rule) == pytest.approx(expected)


def test_warmup_climbs_linearly_from_base_lr_to_scaled_lr_per_step():
    # base 0.1 scaled to 0.4: start factor 0.25; 4 warm-up steps.
    factors = [lr_factor(s, warmup_steps=4, warmup_start_factor=0.25, total_steps=10) for s in range(6)]
    assert factors == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0])


def test_cosine_reaches_zero_at_the_last_step_and_step_schedule_decays():
    cos = [lr_factor(s, warmup_steps=2, warmup_start_factor=0.5, total_steps=10, schedule="cosine") for s in (2, 6, 10)]
    assert cos == pytest.approx([1.0, 0.5, 0.0], abs=1e-12)
    step = [lr_factor(s, warmup_steps=0, warmup_start_factor=1.0, total_steps=10, schedule="step", step_size=3, gamma=0.1) for s in (0, 2, 3, 6)]
    assert step == pytest.approx([1.0, 1.0, 0.1, 0.01])


def test_weight_decay_skips_biases_and_norm_weights():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    decay, no_decay = param_groups(model, 5e-4)
    assert decay["weight_decay"] == 5e-4 and no_decay["weight_decay"] == 0.0
    assert {tuple(p.shape) for p in decay["params"]} == {(4, 1, 3, 3), (2, 4)}
    assert all(p.ndim == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 4


def test_bias_lr_scale_gives_biases_and_norm_weights_that_multiple_of_the_lr_through_warm_up(fashion_root, tmp_path):
    from tests.unit.conftest import tiny_fit

    trainer = tiny_fit(fashion_root, tmp_path, network="fast_cnn", lr=0.05,
                       model_args=dict(bias_lr_scale=8.0, warmup_epochs=2.0, warmup_start_lr=0.005), max_epochs=1)
    weights, biases = trainer.optimizers[0].param_groups
    assert all(p.ndim == 1 for p in biases["params"]) and len(biases["params"]) == 6  # 3 biases, 3 norm weights
    assert weights["lr"] < 0.05 and biases["lr"] == pytest.approx(8 * weights["lr"])  # mid warm-up, both scaled


def test_weight_decay_follows_the_role_not_the_shape_of_flattened_parameters():
    """Under FSDP every parameter is a 1-D shard; weights must still be decayed."""
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    for module in model:
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, nn.Parameter(param.detach().flatten()))
    decay, no_decay = param_groups(model, 0.1)
    assert [p.numel() for p in decay["params"]] == [12]
    assert sorted(p.numel() for p in no_decay["params"]) == [3, 3, 3]


@pytest.mark.parametrize("name", ["sgd", "adamw", "novograd", "lamb", "lars"])
def test_each_optimizer_decreases_a_toy_loss(name):
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)
    lr = {"sgd": 0.05, "adamw": 0.05, "novograd": 0.3, "lamb": 0.3, "lars": 0.5}[name]
    optimizer = build_optimizer(name, param_groups(model, 0.0), lr=lr, momentum=0.9)
    first = None
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        first = first if first is not None else loss.item()
    assert math.isfinite(loss.item()) and loss.item() < 0.5 * first


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="choose one of: sgd, adamw, novograd, lamb, lars"):
        build_optimizer("adam", [nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="none, linear, sqrt"):
        scale_lr(0.1, 1, 2, "cubic")
