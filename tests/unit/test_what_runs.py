"""Everything a run uses is in its config: ``--print_config`` names every callback, logger and plugin the trainer
runs with; a config that leaves out a run-safety callback says so in the start block; a broken order ends at setup."""

import logging

import pytest
import yaml
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.cli import SaveConfigCallback

from callbacks import StopAtTarget
from fashion_mnist_dp import runtime
from fashion_mnist_dp.cli import app as train
from tests.unit.test_cli import printed_config

TINY = ["--network", "mlp", "--epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--test_after_fit", "false"]


class SeenAtTrainStart(Callback):
    """What the trainer runs with once training has started."""

    seen: dict = {}

    def on_train_start(self, trainer, pl_module):
        SeenAtTrainStart.seen = {"callbacks": [type(c) for c in trainer.callbacks],
                                 "loggers": [type(logger) for logger in trainer.loggers],
                                 "checkpoint_io": type(trainer.strategy.checkpoint_io)}


def class_of(entry: dict) -> type:
    module, _, name = entry["class_path"].rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def test_print_config_names_every_callback_logger_and_plugin_the_run_uses(capsys, workdir, fashion_root):
    args = ["--data_dir", str(fashion_root), *TINY, f"--trainer.callbacks+={__name__}.SeenAtTrainStart"]
    config = printed_config(capsys, args)
    assert train.main(args) == 0
    seen = SeenAtTrainStart.seen
    listed = [class_of(entry) for entry in config["trainer"]["callbacks"]]
    # Besides the list, what LightningCLI appends: the stop_at_target section's callback and its config writer
    # (config.yaml in the run folder: SaveConfigAsGiven, a SaveConfigCallback that keeps the derived folders null), and
    # Lightning's ModelSummary (trainer.enable_model_summary).
    expected = [*listed, StopAtTarget, train.SaveConfigAsGiven, ModelSummary]
    assert issubclass(train.SaveConfigAsGiven, SaveConfigCallback)
    assert sorted(map(str, seen["callbacks"])) == sorted(map(str, expected))
    ours = [c for c in listed if c.__module__.split(".")[0] in ("callbacks", "fashion_mnist_dp")]
    assert runtime.RunSafety in listed and len(ours) <= 6
    assert seen["loggers"] == [class_of(entry) for entry in config["trainer"]["logger"]]
    assert [seen["checkpoint_io"]] == [class_of(entry) for entry in config["trainer"]["plugins"]]
    assert seen["checkpoint_io"] is runtime.VerifiedCheckpointIO


def test_a_config_that_drops_the_safety_callbacks_names_each_in_the_start_block(capsys, caplog, workdir,
                                                                                fashion_root):
    """A --config file's trainer.callbacks replaces the whole list."""
    (workdir / "mine.yaml").write_text("trainer:\n  callbacks:\n    - class_path: callbacks.Report\n")
    with caplog.at_level(logging.INFO):
        assert train.main(["--config", "mine.yaml", "--data_dir", str(fashion_root), *TINY]) == 0
    output = capsys.readouterr().out + caplog.text
    off = [line.split(":")[1].strip() for line in output.splitlines() if "safety off" in line]
    assert off == ["JobFaults", "DivergenceGuard", "Preemption", "Agreement", "RngState"], output


def test_the_default_run_has_every_safety_callback_on(capsys, caplog, workdir, fashion_root):
    with caplog.at_level(logging.INFO):
        assert train.main(["--data_dir", str(fashion_root), *TINY]) == 0
    output = capsys.readouterr().out + caplog.text
    assert "Run configuration" in output and "safety off" not in output


@pytest.mark.parametrize("callbacks, first, then", [
    (["Agreement", "DivergenceGuard"], "DivergenceGuard", "Agreement"),
    (["Preemption", "DivergenceGuard", "Agreement"], "DivergenceGuard", "Preemption"),
])
def test_a_broken_order_ends_at_setup_with_one_line_and_exit_2(capsys, workdir, fashion_root, callbacks, first, then):
    listed = [{"class_path": f"fashion_mnist_dp.runtime.{name}"} for name in callbacks]
    (workdir / "mine.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": listed}}))
    code = train.main(["--config", "mine.yaml", "--data_dir", str(fashion_root), *TINY])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [f"train.py: error: {first} must come before {then} in trainer.callbacks "
                                        "(configs/default.yaml lists the order) (see python train.py --help)"]
    assert not (workdir / "runs").exists()  # ended before anything was written


def test_a_part_turned_off_by_its_owners_key_is_named_in_the_start_block(capsys, caplog, workdir, fashion_root):
    """RunSafety(divergence: false): the run goes on without DivergenceGuard, and the start block says what is lost."""
    (workdir / "mine.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "callbacks.Report"},
        {"class_path": "fashion_mnist_dp.runtime.RunSafety", "init_args": {"divergence": False}}]}}))
    with caplog.at_level(logging.INFO):
        assert train.main(["--config", "mine.yaml", "--data_dir", str(fashion_root), *TINY]) == 0
    output = capsys.readouterr().out + caplog.text
    off = [line.split(":")[1].strip() for line in output.splitlines() if "safety off" in line]
    assert off == ["DivergenceGuard"], output
