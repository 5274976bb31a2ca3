"""Every private Lightning attribute we rely on is in fashion_mnist_dp/runtime/compat.py, and is still there in the
installed Lightning; compat's check at start-up turns an optimisation off, or ends a run whose guarantee depends on a
changed attribute, in one line (docs/reliability.md, "Supported versions")."""

import ast
import configparser
import re
from pathlib import Path
from types import ModuleType

import lightning
import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from packaging.version import Version

from fashion_mnist_dp.cli import app
from fashion_mnist_dp.cli.start_block import unseen_settings
from fashion_mnist_dp.runtime import compat

REPO = Path(__file__).resolve().parents[2]
SOURCE = [p for folder in ("fashion_mnist_dp", "callbacks", "datamodules", "lightning_modules")
          for p in (REPO / folder).rglob("*.py")] + [REPO / "train.py"]
# What fashion_mnist_dp/strategies/ overrides or sets on its own subclasses of Lightning's strategies: a hook it may
# call on super(), and fsdp's mesh sizes (one data-parallel dimension of every rank).
OVERRIDDEN_HOOKS = {"_configure_launcher", "_data_parallel_size", "_tensor_parallel_size"}
CHECKED_AGAINST = "2.5.0 and 2.6.6"  # CI's two legs: requirements/oldest.txt and the newest
TINY = ["--network", "mlp", "--epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--test_after_fit", "false"]


def required() -> list:
    """(owner, attribute) pairs compat.py and the strategies' overridden hooks rely on, as of CHECKED_AGAINST."""
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from lightning.fabric.plugins.environments import LightningEnvironment

    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    return [
        (trainer, "_signal_connector"), (trainer._signal_connector, "register_signal_handlers"),
        (_TrainingEpochLoop, "_broadcast_sigterm_tensor"), (_TrainingEpochLoop, "_should_accumulate"),
        (trainer.fit_loop, "_data_fetcher"),
        (launcher, "procs"), (ModelParallelStrategy(), "_data_parallel_size"),
        (ModelParallelStrategy(), "_tensor_parallel_size"),
        # A hook fashion_mnist_dp/strategies/ overrides: dp's one-process launcher check.
        (ParallelStrategy, "_configure_launcher"),
    ]


def missing(pairs) -> list:
    """The pairs' attributes this Lightning lacks, as ``Owner.attribute`` names."""
    return [f"{owner.__name__ if isinstance(owner, (type, ModuleType)) else type(owner).__name__}.{name}"
            for owner, name in pairs if not hasattr(owner, name)]


def test_every_private_attribute_relied_on_is_still_there():
    added = {"_broadcast_sigterm_tensor"} if Version(lightning.__version__) < Version("2.5.2") else set()  # in 2.5.2
    gone = missing([(owner, name) for owner, name in required() if name not in added])
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


def trainer_of(strategy: str = "auto", devices: int = 1) -> Trainer:
    from fashion_mnist_dp.strategies import register_strategies

    register_strategies()
    return Trainer(accelerator="cpu", devices=devices, strategy=strategy, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False)


@pytest.mark.parametrize("strategy", ["auto", "ddp", "fsdp_cpu"])
def test_the_installed_lightning_and_torch_fit_every_access_the_start_up_check_makes(strategy):
    assert compat.unfit(trainer_of(strategy, devices=1 if strategy == "auto" else 2)) == {}


def test_compats_table_holds_only_what_a_guarantee_needs_each_with_the_public_api_it_waits_for():
    """At most ten accesses in all: the start-up check's table, jsonargparse's ``_typehint`` and CPython's
    ``atexit._run_exitfuncs``; beside each, the public API it waits for."""
    source = (REPO / "fashion_mnist_dp" / "runtime" / "compat.py").read_text()
    table = compat._accesses(trainer_of("fsdp_cpu", devices=2))
    assert len(table) + 2 <= 10
    comments = [line for line in source.splitlines() if line.strip().startswith("# waits for:")]
    assert len(comments) == len({serves for _, serves, *_ in table})  # one for each thing served
    assert "Waits\n    for:" in source and "Waits for: a process group" in source  # _typehint's and atexit's


@pytest.mark.skipif(Version(lightning.__version__) < Version("2.5.2"), reason="the broadcast came in Lightning 2.5.2")
@pytest.mark.parametrize("changed", [False, True])
def test_lightnings_per_step_sigterm_broadcast_is_turned_off_only_where_its_shape_fits(monkeypatch, changed):
    """Replaced by a no-argument stand-in where it takes none; a changed one stays Lightning's (a stand-in would raise
    at the first step), and the start block says so."""
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    if changed:
        monkeypatch.setattr(_TrainingEpochLoop, "_broadcast_sigterm_tensor", lambda self, new_argument: None)
    trainer = trainer_of()
    compat.disable_lightning_signal_handling(trainer)
    assert ("_broadcast_sigterm_tensor" in vars(trainer.fit_loop.epoch_loop)) is not changed
    assert (f"{compat.SIGTERM_BROADCAST} (Lightning" in unseen_settings(trainer)[-1]) is changed


def test_a_missing_attribute_a_guarantee_relies_on_ends_in_one_line_before_training(monkeypatch, capsys, workdir,
                                                                                    fashion_root):
    monkeypatch.delattr(_SignalConnector, "register_signal_handlers")
    assert app.main(["--data_dir", str(fashion_root), *TINY]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"train.py: error: Preemption's signal handling (runtime/signals.py) relies on "
                     f"_SignalConnector.register_signal_handlers, which Lightning {lightning.__version__} with torch "
                     f"{torch.__version__} lacks or changed: install {compat.SUPPORTED} (setup.cfg) "
                     f"(see python train.py --help)"]
    assert not (workdir / "runs").exists()


def test_fsdp_on_a_cpu_torch_cannot_run_it_on_ends_in_one_line_naming_the_version_and_ddp(monkeypatch, capsys, workdir,
                                                                                          fashion_root):
    monkeypatch.delattr(torch.cpu.Stream, "record_event", raising=False)  # as torch 2.6's CPU streams
    assert app.main(["--data_dir", str(fashion_root), *TINY, "--strategy", "fsdp", "--accelerator", "cpu",
                     "--devices", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--strategy fsdp on CPU needs torch >= 2.7" in lines[0]
    assert "use --strategy ddp on CPU" in lines[0] and not (workdir / "runs").exists()


@pytest.mark.parametrize("lightning_before_2_6", [False, True])
def test_fsdp_loads_a_checkpoint_on_lightning_2_5_and_2_6(monkeypatch, lightning_before_2_6):
    """Lightning 2.6's ModelParallelStrategy.load_checkpoint takes weights_only (given True); 2.5's takes no such
    argument (fsdp's resume and its test of the best checkpoint ended in a TypeError there)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from fashion_mnist_dp.strategies.fsdp import FullyShardedStrategy

    calls = []

    def lightning_2_6(self, checkpoint_path, weights_only=None):
        calls.append((checkpoint_path, weights_only))
        return {"state_dict": {}}

    def lightning_2_5(self, checkpoint_path):
        calls.append((checkpoint_path, "no such argument"))
        return {"state_dict": {}}

    monkeypatch.setattr(ModelParallelStrategy, "load_checkpoint", lightning_2_5 if lightning_before_2_6 else
                        lightning_2_6)
    assert FullyShardedStrategy().load_checkpoint("best.ckpt") == {"state_dict": {}}
    assert calls == [("best.ckpt", "no such argument" if lightning_before_2_6 else True)]


def floors() -> dict:
    """setup.cfg's install_requires: package -> its lowest version."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    found = [re.match(r"([\w-]+)(\[[\w,]+\])?>=([\d.]+)", line.strip())
             for line in setup["options"]["install_requires"].strip().splitlines()]
    return {match.group(1): match.group(3) for match in found}


def test_setup_cfg_floors_are_the_oldest_legs_pins_and_the_supported_range_starts_there():
    pins = dict(line.split("==") for line in (REPO / "requirements" / "oldest.txt").read_text().split()
                if "==" in line)
    assert {name: pins.get(name) for name in floors()} == floors()
    assert compat.SUPPORTED.startswith(f"Lightning {floors()['lightning']} to ")
    assert f" with torch {floors()['torch']} to " in compat.SUPPORTED
