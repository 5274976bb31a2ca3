"""LeanDispatch (configs/default.yaml): Lightning's callback hooks reach only the callbacks that override them, and
everything that runs runs as under Lightning's own dispatch: the same hooks, order, ``_current_fx_name``, logged
values and checkpoints."""

import pytest
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.profilers import SimpleProfiler

from callbacks import LeanDispatch

# Every hook Lightning dispatches to callbacks (state_dict/load_state_dict are called directly, not dispatched).
HOOKS = [name for name, value in vars(Callback).items()
         if callable(value) and (name.startswith("on_") or name in ("setup", "teardown"))]


class Everything(Callback):
    """Records each hook it receives, with the LightningModule's hook name at that moment."""

    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    @property
    def state_key(self) -> str:
        return f"Everything[{self.name}]"


for _hook in HOOKS:
    setattr(Everything, _hook, lambda self, trainer, module, *a, _hook=_hook, **k:
            self.calls.append((self.name, _hook, module._current_fx_name)))


class BatchEndOnly(Callback):
    """Overrides one hook, and logs from it (``self.log`` needs the hook's name set on the module)."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls.append(("batch end only", "on_train_batch_end", module._current_fx_name))
        module.log("from_a_callback", float(batch_idx))


class Model(BoringModel):
    def validation_step(self, batch, batch_idx):
        loss = super().validation_step(batch, batch_idx)["x"]
        self.log("val_loss", loss)


def run(tmp_path, lean: bool, profiler=None) -> tuple:
    calls: list = []
    own_instance_hook = Callback()  # a plain Callback with a hook set on the instance
    own_instance_hook.on_train_epoch_end = lambda trainer, module: calls.append(("instance", "on_train_epoch_end",
                                                                                module._current_fx_name))
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val_loss", save_top_k=2)
    callbacks = [Everything("a", calls), Callback(), BatchEndOnly(calls), own_instance_hook, checkpoint,
                 Everything("b", calls)] + ([LeanDispatch()] if lean else [])
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=2,
                      callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", devices=1, profiler=profiler)
    seed_everything(0)
    trainer.fit(Model())
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    trainer.validate(Model(), ckpt_path=checkpoint.best_model_path, verbose=False)
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    return calls, files, metrics


@pytest.mark.filterwarnings("ignore:The '(train|val)_dataloader' does not have many workers")
def test_every_overriding_callback_runs_each_hook_in_the_same_order_as_under_lightnings_dispatch(tmp_path):
    lightning_calls, lightning_files, lightning_metrics = run(tmp_path / "lightning", lean=False)
    lean_calls, lean_files, lean_metrics = run(tmp_path / "lean", lean=True)
    assert ("batch end only", "on_train_batch_end", "on_train_batch_end") in lean_calls
    assert ("instance", "on_train_epoch_end", "on_train_epoch_end") in lean_calls
    assert {hook for name, hook, _ in lean_calls if name == "a"} >= {"on_train_batch_start", "on_validation_end",
                                                                    "on_save_checkpoint", "teardown"}
    assert lean_calls == lightning_calls
    assert lean_files == lightning_files and len(lean_files) == 2
    assert lean_metrics == lightning_metrics and "from_a_callback" in lean_metrics


@pytest.mark.filterwarnings("ignore:The '(train|val)_dataloader' does not have many workers")
def test_a_hook_left_as_callbacks_no_op_is_not_called_and_the_others_keep_their_profiler_label(tmp_path):
    lean, lightning = SimpleProfiler(), SimpleProfiler()
    run(tmp_path / "lean", lean=True, profiler=lean)
    run(tmp_path / "lightning", lean=False, profiler=lightning)
    plain = "[Callback]Callback.on_train_batch_start"  # the state key of a plain Callback() is its class name
    assert plain in lightning.recorded_durations and plain not in lean.recorded_durations
    labels = [label for label in lightning.recorded_durations if label.startswith("[Callback]Everything")]
    assert len(labels) > 20 and all(label in lean.recorded_durations for label in labels)
    assert len(lean.recorded_durations["[Callback]Everything[a].on_train_batch_end"]) == 6


def test_a_trainer_without_it_in_the_same_process_gets_lightnings_dispatch(tmp_path):
    """The dispatch is replaced for the trainers that list LeanDispatch only, and only until their teardown."""
    run(tmp_path / "lean", lean=True)
    calls: list = []
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0,
                      callbacks=[Everything("a", calls)], logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=1,
                      profiler=SimpleProfiler())
    trainer.fit(BoringModel())
    assert "[Callback]Callback.on_train_batch_start" not in trainer.profiler.recorded_durations  # no plain callback
    assert "[Callback]Everything[a].on_train_batch_start" in trainer.profiler.recorded_durations
