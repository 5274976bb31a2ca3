"""WeightEMA: the average is the closed-form EMA, updated without reading the device; validation, the end of fit and
checkpoints use it, training goes on from the live weights, and a resume continues both exactly."""

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback

from callbacks import WeightEMA
from callbacks.weight_ema import LIVE_KEY
from tests.host_reads import READS


def weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}


def ema(history, decay):
    average = dict(history[0])
    for w in history[1:]:
        average = {k: decay * average[k] + (1 - decay) * w[k] for k in average}
    return average


def assert_close(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)


def test_an_update_is_the_ema_of_the_steps_weights_and_never_reads_the_device(monkeypatch):
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    callback = WeightEMA(decay=0.75, every_n_steps=2, start_step=2)
    reads = []
    for name in READS:
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: reads.append(_n) or _o(self, *a, **k))
    history = []
    for step in range(1, 9):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn_like(p))
            net[1].running_mean.add_(1.0)
        if step >= 2 and step % 2 == 0:
            history.append(weights(net))
        for _ in range(2):  # accumulation's second micro-batch: same optimizer step, no second update
            callback.on_train_batch_end(SimpleNamespace(global_step=step), net, None, None, 0)
    monkeypatch.undo()
    assert reads == [] and callback.updates == 4  # steps 2, 4, 6, 8
    assert_close(callback._average, ema(history, 0.75))  # running statistics averaged too


class Recorder(Callback):
    """Listed before WeightEMA: the live weights after each step and at each step's start; what validation sees."""

    def __init__(self):
        self.after_step, self.at_start, self.validated = [], [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.at_start.append(weights(pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after_step.append(weights(pl_module))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and batch_idx == 0:
            self.validated.append(weights(pl_module))


def fit(root, folder, callbacks, max_epochs, ckpt_path=None, checkpoints=False):
    """tiny_fit's mlp from seed 7, optionally resumed from ``ckpt_path``."""
    from lightning.pytorch import Trainer, seed_everything

    from datamodules import FashionMNISTDataModule
    from tests.unit.conftest import classifier

    seed_everything(7)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=checkpoints, default_root_dir=str(folder),
                      callbacks=callbacks)
    trainer.fit(classifier("mlp", batch_size=32),
                datamodule=FashionMNISTDataModule(data_dir=str(root), batch_size=32, download=False), ckpt_path=ckpt_path)
    return trainer


def test_validation_sees_the_average_training_goes_on_from_the_live_weights_and_fit_ends_with_the_average(
        fashion_root, tmp_path):
    recorder = Recorder()
    trainer = fit(fashion_root, tmp_path, [recorder, WeightEMA(decay=0.5)], max_epochs=2)
    steps = recorder.after_step
    assert len(steps) == 16  # 8 steps per epoch
    assert_close(recorder.validated[0], ema(steps[:8], 0.5))
    assert_close(recorder.validated[1], ema(steps, 0.5))
    assert_close(recorder.at_start[8], steps[7])  # epoch 2 trains on from the live weights, not the average
    final = weights(trainer.lightning_module)
    assert_close(final, ema(steps, 0.5))
    assert not all(torch.allclose(final[k], steps[-1][k]) for k in final)  # the average is not the last weights


def test_a_checkpoint_holds_the_average_and_a_resume_continues_exactly(fashion_root, tmp_path):
    full = fit(fashion_root, tmp_path / "full", [WeightEMA(decay=0.5)], max_epochs=2)
    first = Recorder()
    fit(fashion_root, tmp_path / "first", [first, WeightEMA(decay=0.5)], max_epochs=1, checkpoints=True)
    path, = (tmp_path / "first").rglob("*.ckpt")
    saved = torch.load(path, weights_only=True)  # plain tensors and numbers: loadable without running code
    assert_close({k: saved["state_dict"][k] for k in saved[LIVE_KEY]}, ema(first.after_step, 0.5))
    assert_close(saved[LIVE_KEY], first.after_step[-1])
    tested = fit(fashion_root, tmp_path / "tested", [WeightEMA(decay=0.5)], max_epochs=0)
    tested.test(tested.lightning_module, datamodule=tested.datamodule, ckpt_path=str(path), verbose=False)
    assert_close(weights(tested.lightning_module), ema(first.after_step, 0.5))  # test evaluates the average
    resumed = fit(fashion_root, tmp_path / "resumed", [WeightEMA(decay=0.5)], max_epochs=2, ckpt_path=str(path))
    assert_close(weights(resumed.lightning_module), weights(full.lightning_module))


def test_a_decay_outside_0_to_1_is_refused_with_one_line():
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=r"decay=1.0 must be in \[0, 1\)"):
        WeightEMA(decay=1.0)
