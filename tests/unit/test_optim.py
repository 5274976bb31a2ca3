"""The learning-rate rule, warm-up and optimizers: the numbers users otherwise derive by hand."""

import math

import pytest
import torch
from torch import nn

from lightning_modules.lr_policy import lr_factor, scale_lr
from lightning_modules.optim import check_optimizer, param_groups
from tests.unit.conftest import classifier, tiny_fit


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
    optimizer = torch.optim.SGD(param_groups(model), lr=0.1, weight_decay=5e-4)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 5e-4 and no_decay["weight_decay"] == 0.0
    assert {tuple(p.shape) for p in decay["params"]} == {(4, 1, 3, 3), (2, 4)}
    assert all(p.ndim == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 4


def test_weight_decay_follows_the_role_not_the_shape_of_flattened_parameters():
    """Under FSDP every parameter is a 1-D shard; weights must still be decayed."""
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    for module in model:
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, nn.Parameter(param.detach().flatten()))
    decay, no_decay = param_groups(model)
    assert [p.numel() for p in decay["params"]] == [12]
    assert sorted(p.numel() for p in no_decay["params"]) == [3, 3, 3]


OPTIMIZERS = {"sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9)), "adamw": (torch.optim.AdamW, dict(lr=0.05)),
              "novograd": ("NovoGrad", dict(lr=0.3, grad_averaging=True)), "lamb": ("Lamb", dict(lr=0.3)),
              "lars": ("LARS", dict(lr=0.5, momentum=0.9)),
              "rmsprop": (torch.optim.RMSprop, dict(lr=0.05, alpha=0.9))}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_optimizer_decreases_a_toy_loss(name):
    import torch_optimizer

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)
    kind, args = OPTIMIZERS[name]
    kind = getattr(torch_optimizer, kind) if isinstance(kind, str) else kind
    optimizer = kind(param_groups(model), **args)
    first = None
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        first = first if first is not None else loss.item()
    assert math.isfinite(loss.item()) and loss.item() < 0.5 * first


@pytest.mark.parametrize("args, message", [
    (dict(lr=-1.0), "model.optimizer <lambda> cannot be built: ValueError: Invalid learning rate: -1.0"),
    (dict(lr=0.1, nesterov=True), "model.optimizer <lambda> cannot be built: ValueError: Nesterov momentum requires"),
    (dict(lr=float("inf")), "model.optimizer's lr must be a finite number, got inf"),
    (dict(lr=0.1, momentum=1.0), "model.optimizer's momentum must be >= 0 and < 1 (e.g. 0.9), got 1.0"),
    (dict(lr=0.1, betas=(0.9, 0.99)), "model.optimizer <lambda> cannot be built: TypeError: SGD.__init__() got an unexpected"),
])
def test_an_optimizer_that_cannot_train_is_refused_with_what_is_wrong(args, message):
    with pytest.raises(ValueError) as refused:
        check_optimizer(lambda params: torch.optim.SGD(params, **args))
    assert str(refused.value).startswith(message)


def test_the_model_applies_the_policy_to_any_optimizers_own_lr(fashion_root, tmp_path):
    """RMSprop, which the project names nowhere: its lr is the base lr, its alpha stays, the scaled lr trains."""
    from lightning_modules import LRPolicy

    trainer = tiny_fit(fashion_root, tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                       model_args=dict(optimizer=torch.optim.RMSprop, lr_policy=LRPolicy(base_batch_size=8)))
    (weights, biases), = [trainer.optimizers[0].param_groups]
    assert type(trainer.optimizers[0]) is torch.optim.RMSprop and weights["alpha"] == 0.99
    assert weights["lr"] == biases["lr"] == pytest.approx(0.05 * 32 / 8)  # linear: batch 32 over base batch 8
    assert (weights["weight_decay"], biases["weight_decay"]) == (5e-4, 0.0)


def test_unknown_rules_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="none, linear, sqrt"):
        scale_lr(0.1, 1, 2, "cubic")
    with pytest.raises(ValueError, match="constant, cosine, step"):
        lr_factor(5, warmup_steps=0, warmup_start_factor=1.0, total_steps=10, schedule="linear")


def test_a_model_built_in_python_keeps_plain_hyperparameters_that_load_without_code(tmp_path, recwarn):
    """From a config the hyperparameters are its class paths (tests/test_standalone.py); built in Python, the network,
    optimizer and policy objects are no hyperparameters, so a checkpoint's stay loadable with weights_only."""
    model = classifier(label_smoothing=0.1)
    assert not {"network", "optimizer", "lr_policy"} & (set(model.hparams) | set(model.hparams_initial))
    assert model.hparams["label_smoothing"] == 0.1
    torch.save({"hyper_parameters": dict(model.hparams)}, tmp_path / "h.ckpt")
    assert torch.load(tmp_path / "h.ckpt", weights_only=True)["hyper_parameters"]["label_smoothing"] == 0.1
    assert not [w for w in recwarn if "nn.Module" in str(w.message)]
