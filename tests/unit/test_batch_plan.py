"""The batch plan and the learning-rate policy: the batch and learning-rate numbers users otherwise derive by hand, and
step counts that are Lightning's own."""

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from datamodules import FashionMNISTDataModule
from lightning_modules import LRPolicy
from lightning_modules.lr_policy import BatchPlan
from tests.unit.conftest import classifier


def plan(**overrides) -> BatchPlan:
    settings = dict(batch_size_per_device=128, devices_per_process=1, devices=1, virtual_devices=1, num_nodes=1,
                    world_size=1, accumulate_grad_batches=1, steps_per_epoch=469, total_steps=1407)
    settings.update(overrides)
    return BatchPlan(**settings)


def test_effective_batch_counts_devices_nodes_and_accumulation_and_scales_the_lr():
    p = plan(devices=4, num_nodes=2, world_size=8, accumulate_grad_batches=3)
    assert p.effective_batch_size == 128 * 4 * 2 * 3 == 3072
    rates = LRPolicy().learning_rates(0.05, p)
    assert rates.base_batch_size == 128 and rates.scaled_lr == pytest.approx(0.05 * 24)
    assert LRPolicy(scaling="sqrt").learning_rates(0.05, plan(devices=4)).scaled_lr == pytest.approx(0.1)
    assert LRPolicy(base_batch_size=256).learning_rates(0.05, plan(devices=4)).scaled_lr == pytest.approx(0.1)
    assert LRPolicy(scaling="none").learning_rates(0.05, plan(devices=4)).scaled_lr == 0.05


def test_dp_drives_several_gpus_from_one_process():
    p = plan(devices=3, devices_per_process=3)
    assert (p.batch_size_per_process, p.effective_batch_size) == (384, 384)


def test_warmup_steps_and_the_start_block_lines():
    p = plan()
    rates = LRPolicy(warmup_epochs=0.5, schedule="cosine").learning_rates(0.05, p)
    assert rates.warmup_steps == 234 and rates.warmup_start_lr == 0.05
    assert p.describe() == "128 per device x 1 x 1 x accumulate 1 = effective 128"
    assert "warm-up         : 234 optimizer steps (469 per epoch), then cosine" in rates.describe(p)


def test_the_policy_sets_the_scaled_lr_and_warms_up_from_the_start_lr_per_step():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    rates, schedule = LRPolicy(scaling="linear", warmup_epochs=1, warmup_start_lr=0.01).apply(
        optimizer, plan(batch_size_per_device=32, devices=2, steps_per_epoch=5, total_steps=10))
    assert rates.scaled_lr == pytest.approx(0.2)
    lrs = []
    for _ in range(7):
        lrs.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert lrs[0] == pytest.approx(0.01) and lrs[5] == pytest.approx(0.2) and lrs == sorted(lrs)


def test_a_policy_value_that_is_not_finite_is_refused():
    with pytest.raises(ValueError, match="model.lr_policy.warmup_epochs must be a finite number"):
        LRPolicy(warmup_epochs=float("inf"))


class _CompareWithLightning(Callback):
    def on_train_start(self, trainer, pl_module):
        self.seen = (pl_module.batch_plan.total_steps, trainer.estimated_stepping_batches,
                     pl_module.batch_plan.steps_per_epoch, trainer.num_training_batches)
        trainer.should_stop = True


@pytest.mark.parametrize("trainer_args", [
    dict(max_epochs=3), dict(max_epochs=2, limit_train_batches=3), dict(max_epochs=2, limit_train_batches=0.5),
    dict(max_epochs=3, accumulate_grad_batches=3), dict(max_epochs=3, max_steps=5), dict(max_epochs=-1, max_steps=7),
], ids=["plain", "limit-int", "limit-float", "accumulate", "max-steps", "no-epoch-limit"])
def test_step_counts_are_lightnings_estimate(fashion_root, workdir, trainer_args):
    compare = _CompareWithLightning()
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, limit_val_batches=0,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[compare], **trainer_args)
    data = FashionMNISTDataModule(data_dir=str(fashion_root), batch_size=32, download=False)
    trainer.fit(classifier("mlp", batch_size=32), datamodule=data)
    total, estimated, per_epoch, batches = compare.seen
    accumulate = trainer_args.get("accumulate_grad_batches", 1)
    assert total == estimated and per_epoch == -(-batches // accumulate) > 0, compare.seen


def test_virtual_devices_count_in_the_batch_and_the_lr_rule_but_not_in_the_world():
    p = plan(virtual_devices=8)
    assert (p.world_size, p.batch_size_per_process, p.effective_batch_size) == (1, 1024, 1024)
    assert LRPolicy().learning_rates(0.05, p).scaled_lr == pytest.approx(0.4)
    assert p.describe() == "128 per device x 1 x 8 virtual x 1 x accumulate 1 = effective 1024"
