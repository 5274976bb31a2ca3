"""callbacks.checkpoints.ModelCheckpoint: Lightning's, with the same state key (checkpoints load in both), made once
(Lightning asks for it at every hook call), and saving at the same steps."""

from datetime import timedelta

import pytest
import yaml
from lightning.pytorch import Trainer, callbacks
from lightning.pytorch.demos.boring_classes import BoringModel

from callbacks.checkpoints import ModelCheckpoint
from fashion_mnist_dp.cli.app import main


def test_the_state_key_is_lightnings_and_is_formatted_once(monkeypatch):
    settings = dict(monitor="val/acc", mode="max", every_n_epochs=1)
    ours = ModelCheckpoint(**settings)
    formatted = []
    generate = callbacks.ModelCheckpoint._generate_state_key
    monkeypatch.setattr(callbacks.ModelCheckpoint, "_generate_state_key",
                        lambda self, **kwargs: formatted.append(kwargs) or generate(self, **kwargs))
    keys = {ours.state_key for _ in range(12)}
    assert keys == {callbacks.ModelCheckpoint(**settings).state_key} and len(formatted) == 2  # ours once, Lightning's once


# A time interval of 1 µs: Lightning 2.4 takes 0 as no interval (``if train_time_interval:``), 2.6 as every step.
@pytest.mark.parametrize("settings", [{}, {"every_n_train_steps": 2}, {"train_time_interval": timedelta(microseconds=1)}],
                         ids=["epochs only", "every 2 steps", "every step by time"])
def test_it_saves_at_the_steps_lightnings_saves_at(tmp_path, settings):
    """Its batch-end hook is skipped only where Lightning's finds nothing to do: the same files, in any setting."""
    saved = {}
    for name, kind in (("ours", ModelCheckpoint), ("lightning", callbacks.ModelCheckpoint)):
        folder = tmp_path / name
        checkpoint = kind(dirpath=folder, filename="{epoch}-{step}", save_top_k=-1, **settings)
        trainer = Trainer(default_root_dir=folder, max_epochs=2, limit_train_batches=5, limit_val_batches=1,
                          callbacks=[checkpoint], logger=False, enable_progress_bar=False,
                          enable_model_summary=False, accelerator="cpu", devices=1)
        trainer.fit(BoringModel())
        saved[name] = sorted(path.name for path in folder.glob("*.ckpt"))
    assert saved["ours"] == saved["lightning"] and len(saved["ours"]) >= 2


def test_the_test_after_fit_finds_the_best_checkpoint_behind_another_checkpoint_callback(workdir, fashion_root, caplog):
    """Lightning's ``checkpoint_callback`` is the first ``Checkpoint`` of any kind: here OnExceptionCheckpoint, which
    has no best_model_path. The test after fit still loads the ModelCheckpoint's best."""
    config = workdir / "callbacks.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "lightning.pytorch.callbacks.OnExceptionCheckpoint", "init_args": {"dirpath": "on_exception"}},
        {"class_path": "callbacks.checkpoints.ModelCheckpoint", "init_args": {"monitor": "val/acc", "mode": "max"}}]}}))
    caplog.set_level("INFO")
    assert main(["--config", str(config), "--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "2",
                 "--data.val_size", "50"]) == 0
    restored = [r.getMessage() for r in caplog.records if "Restoring states from the checkpoint path" in r.getMessage()]
    assert len(restored) == 1 and "epoch=" in restored[0]  # the test after fit, from the best by val/acc
