"""Every private Lightning attribute we rely on is in fashion_mnist_dp/runtime/compat.py, and is still there in the installed Lightning."""

import ast
from pathlib import Path
from types import ModuleType

import lightning
import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

REPO = Path(__file__).resolve().parents[2]
SOURCE = [p for folder in ("fashion_mnist_dp", "callbacks", "datamodules", "lightning_modules")
          for p in (REPO / folder).rglob("*.py")] + [REPO / "train.py"]
# What fashion_mnist_dp/strategies/ overrides or sets on its own subclasses of Lightning's strategies: a hook it may
# call on super(), and fsdp's mesh sizes (one data-parallel dimension of every rank).
OVERRIDDEN_HOOKS = {"_configure_launcher", "_data_parallel_size", "_tensor_parallel_size"}
CHECKED_AGAINST = "2.6.6"


def required() -> list:
    """(owner, attribute) pairs compat.py and the strategies' overridden hooks rely on, as of CHECKED_AGAINST."""
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.trainer import call
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, ParallelStrategy
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from lightning.pytorch.trainer.connectors.data_connector import _DataHookSelector
    from lightning.fabric.plugins.environments import LightningEnvironment
    from torch.distributed.fsdp import FSDPModule
    from torch.utils.tensorboard import SummaryWriter

    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    return [
        (trainer, "_signal_connector"), (trainer._signal_connector, "register_signal_handlers"),
        (_TrainingEpochLoop, "_broadcast_sigterm_tensor"), (_TrainingEpochLoop, "_should_accumulate"),
        (trainer.fit_loop, "_data_fetcher"),
        (trainer, "_data_connector"), (trainer._data_connector, "_datahook_selector"),
        (_DataHookSelector, "_valid_hooks"), (_DataHookSelector, "get_instance"),
        (ModelCheckpoint(), "_every_n_train_steps"), (ModelCheckpoint(), "_train_time_interval"),
        (SummaryWriter, "_get_file_writer"),
        (launcher, "procs"), (ModelParallelStrategy(), "_data_parallel_size"),
        (DDPStrategy(), "_ddp_comm_hook"), (DDPStrategy(), "_ddp_comm_state"), (FSDPModule, "_get_fsdp_state"),
        (DDPStrategy(), "_timeout"), (ModelParallelStrategy(), "_timeout"),
        (ModelParallelStrategy(), "_tensor_parallel_size"),
        # A hook fashion_mnist_dp/strategies/ overrides: dp's one-process launcher check.
        (ParallelStrategy, "_configure_launcher"),
        (call, "_call_callback_hooks"), (BoringModel(), "_current_fx_name"),
    ]


def missing(pairs) -> list:
    """The pairs' attributes this Lightning lacks, as ``Owner.attribute`` names."""
    return [f"{owner.__name__ if isinstance(owner, (type, ModuleType)) else type(owner).__name__}.{name}"
            for owner, name in pairs if not hasattr(owner, name)]


def test_every_private_attribute_relied_on_is_still_there():
    gone = missing(required())
    assert gone == [], (f"Lightning {lightning.__version__} no longer has {', '.join(gone)} (fashion_mnist_dp/runtime/"
                        f"compat.py was checked against {CHECKED_AGAINST}): adapt fashion_mnist_dp/runtime/compat.py")


def test_a_removed_attribute_is_named(monkeypatch):
    monkeypatch.delattr(ModelCheckpoint, "_save_checkpoint")  # not ours: only the naming is tested
    assert missing([(ModelCheckpoint, "_save_checkpoint"), (ModelCheckpoint, "CHECKPOINT_NAME_LAST")]) == \
        ["ModelCheckpoint._save_checkpoint"]


def test_no_other_module_touches_them():
    """The private names compat relies on appear in no other source module (but the strategies' own hooks)."""
    names = {name for _, name in required()} - OVERRIDDEN_HOOKS
    found = []
    for path in SOURCE:
        if path.name == "compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            touched = node.attr if isinstance(node, ast.Attribute) else getattr(node, "value", None)
            if isinstance(touched, str) and touched in names and isinstance(node, (ast.Attribute, ast.Constant)):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {touched}")
            if isinstance(node, ast.Attribute) and node.attr in OVERRIDDEN_HOOKS and path.parent.name != "strategies":
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert found == []


@pytest.mark.parametrize("path", SOURCE, ids=lambda p: str(p.relative_to(REPO)))
def test_no_source_module_is_over_300_lines(path):
    assert len(path.read_text().splitlines()) <= 300


def test_no_line_of_non_test_python_is_over_120_characters():
    """benchmarks/lines.py lists them; the harness and the code beside it have none (docs/architecture.md, "Size of
    the harness")."""
    tools = [p for folder in ("benchmarks", "experiments") for p in (REPO / folder).rglob("*.py")]
    long = [f"{path.relative_to(REPO)}:{number}" for path in SOURCE + tools
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 120]
    assert long == []


@pytest.mark.filterwarnings("ignore:You have overridden `on_before_batch_transfer`")  # Lightning's, as meant here
def test_each_batch_hook_still_runs_once_a_batch_from_its_owner_when_the_owners_are_asked_once():
    """compat.ask_batch_hook_owners_once (LeanDispatch, at train start): the model's own hook and the
    datamodule's run as Lightning would run them, once a batch."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
    from lightning.pytorch import Callback

    from fashion_mnist_dp.runtime import compat

    ran = []

    class Model(BoringModel):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            ran.append("model: before")
            return batch

    class Data(BoringDataModule):
        def on_after_batch_transfer(self, batch, dataloader_idx):
            ran.append("data: after")
            return batch

    class AskOnce(Callback):
        def on_train_start(self, trainer, pl_module):
            compat.ask_batch_hook_owners_once(trainer)
            ran.clear()

    trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0, callbacks=[AskOnce()], logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      accelerator="cpu", devices=1)
    trainer.fit(Model(), datamodule=Data())
    assert ran == ["model: before", "data: after"] * 3
