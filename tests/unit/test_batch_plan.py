"""The batch plan: one object holds the batch and learning-rate numbers, and its step counts are Lightning's."""

import pytest
from lightning.pytorch import Callback, Trainer

from datamodules import FashionMNISTDataModule
from lightning_modules import FashionMNISTClassifier
from lightning_modules.batch_plan import BatchPlan, batches_per_epoch, format_plan


def plan(**overrides) -> BatchPlan:
    settings = dict(batch_size_per_device=128, devices=1, num_nodes=1, world_size=1, accumulate=1,
                    devices_per_process=1, base_lr=0.05, base_batch_size=None, lr_scaling="linear",
                    warmup_epochs=0.0, train_images=60000, max_epochs=3)
    settings.update(overrides)
    return BatchPlan.build(**settings)


def test_effective_batch_counts_devices_nodes_and_accumulation_and_scales_the_lr():
    p = plan(devices=4, num_nodes=2, world_size=8, accumulate=3)
    assert p.effective_batch_size == 128 * 4 * 2 * 3 == 3072
    assert p.base_batch_size == 128 and p.scaled_lr == pytest.approx(0.05 * 24)
    assert plan(lr_scaling="sqrt", devices=4, world_size=4).scaled_lr == pytest.approx(0.1)
    assert plan(base_batch_size=256, devices=4, world_size=4).scaled_lr == pytest.approx(0.1)


def test_dp_drives_several_gpus_from_one_process():
    p = plan(devices=3, world_size=1, devices_per_process=3)
    assert (p.batch_size_per_process, p.effective_batch_size, p.loader_batch(1000)) == (384, 384, 3000)
    assert p.steps_per_epoch == batches_per_epoch(60000, 1, 384) == 157


def test_steps_and_warmup_of_the_default_run():
    p = plan(warmup_epochs=0.5)
    assert (p.steps_per_epoch, p.total_steps, p.warmup_steps) == (469, 1407, 234)
    assert plan(train_images=None).total_steps == 0  # not fitting
    assert plan(max_steps=100).total_steps == 100 and plan(max_epochs=-1).total_steps == 0
    assert "128 per device x 1 x 1 x accumulate 1 = effective 128" in format_plan(p, "cpu", "ddp", "gloo", "sgd", "cosine")


def test_batches_per_epoch_pads_shards_and_applies_lightnings_limits():
    assert batches_per_epoch(101, 2, 10) == 6  # 51 per rank
    assert batches_per_epoch(256, 1, 32, limit=3) == 3 and batches_per_epoch(256, 1, 32, limit=0.5) == 4
    assert batches_per_epoch(256, 1, 32, limit=1.0) == 8 and batches_per_epoch(256, 1, 32, limit=100) == 8


class _CompareWithLightning(Callback):
    def on_train_start(self, trainer, pl_module):
        self.seen = (pl_module.batch_plan.total_steps, trainer.estimated_stepping_batches,
                     pl_module.batch_plan.steps_per_epoch, trainer.num_training_batches)
        trainer.should_stop = True


@pytest.mark.parametrize("trainer_args", [
    dict(max_epochs=3), dict(max_epochs=2, limit_train_batches=3), dict(max_epochs=2, limit_train_batches=0.5),
    dict(max_epochs=3, accumulate_grad_batches=3), dict(max_epochs=3, max_steps=5),
], ids=["plain", "limit-int", "limit-float", "accumulate", "max-steps"])
def test_step_counts_equal_lightnings_estimate(fashion_root, workdir, trainer_args):
    compare = _CompareWithLightning()
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, limit_val_batches=0,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[compare], **trainer_args)
    data = FashionMNISTDataModule(data_dir=str(fashion_root), batch_size=32, download=False)
    trainer.fit(FashionMNISTClassifier(batch_size=32, network="mlp"), datamodule=data)
    total, estimated, per_epoch, batches = compare.seen
    accumulate = trainer_args.get("accumulate_grad_batches", 1)
    assert total == estimated and per_epoch == -(-batches // accumulate), compare.seen


def test_virtual_devices_count_in_the_batch_and_the_lr_rule_but_not_in_the_world():
    p = plan(virtual_devices=8, lr_scaling="linear")
    assert (p.world_size, p.batch_size_per_process, p.effective_batch_size) == (1, 1024, 1024)
    assert p.scaled_lr == pytest.approx(0.4) and p.steps_per_epoch == batches_per_epoch(60000, 8, 128) == 59
    assert "128 per device x 1 x 8 virtual x 1 x accumulate 1 = effective 1024" in format_plan(p, "cpu", "auto",
                                                                                               "none", "sgd", "constant")
