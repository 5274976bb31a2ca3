"""train.py as users type it: both command-line forms, config files, help, and one-line errors."""

from pathlib import Path

import pytest
import yaml

from fashion_mnist_dp.cli import app as train
from fashion_mnist_dp.cli.checkpoint_hparams import flat
from tests.conftest import REPO

CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml"))


def printed_config(capsys, args) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        train.main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_shorthand_and_full_keys_give_the_same_config(capsys, workdir):
    short = printed_config(
        capsys,
        ["--strategy", "ddp", "--devices", "4", "--accelerator", "cpu", "--num_nodes", "2", "--precision", "bf16-mixed",
         "--epochs", "7", "--batch_size", "64", "--lr", "0.2", "--optimizer", "lamb", "--seed", "3"],
    )
    full = printed_config(
        capsys,
        ["fit", "--trainer.strategy", "ddp", "--trainer.devices", "4", "--trainer.accelerator", "cpu",
         "--trainer.num_nodes", "2", "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "7",
         "--data.batch_size", "64", "--model.optimizer.init_args.lr", "0.2", "--model.optimizer",
         "torch_optimizer.Lamb", "--seed_everything", "3"],
    )
    assert short == full
    assert short["trainer"]["strategy"] == "ddp" and short["trainer"]["max_epochs"] == 7
    assert short["data"]["batch_size"] == 64 and short["seed_everything"] == 3
    optimizer = short["model"]["optimizer"]
    assert optimizer["class_path"] == "torch_optimizer.Lamb" and optimizer["init_args"]["lr"] == 0.2
    assert optimizer["init_args"]["weight_decay"] == 0.0005  # carried over from the default SGD; its momentum not


def test_default_config_is_loaded_without_flags(capsys, workdir):
    config = printed_config(capsys, [])
    assert config["trainer"]["default_root_dir"] == "runs"
    assert config["trainer"]["logger"] == [{"class_path": "callbacks.run_record.MetricsCSV", "init_args": {
        "save_dir": None, "name": None, "version": None, "default_hp_metric": False, "log_graph": False, "prefix": "",
        "sub_dir": None, "comment": "", "purge_step": None, "write_every_s": 5.0, "max_queue": 10, "flush_secs": 120,
        "filename_suffix": ""}}]  # save_dir and name filled in at the run: default_root_dir, the run's name
    callbacks = [c["class_path"] for c in config["trainer"]["callbacks"]]
    assert "callbacks.Report" in callbacks and "callbacks.checkpoints.ModelCheckpoint" in callbacks
    assert len([c for c in callbacks if not c.startswith("lightning.")]) <= 6  # the project's owners
    assert config["model"]["network"]["class_path"] == "lightning_modules.networks.SmallCNN"
    assert config["model"]["optimizer"] == {"class_path": "torch.optim.SGD", "init_args": {
        "lr": 0.05, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0005, "nesterov": False, "maximize": False,
        "foreach": None, "differentiable": False, "fused": None}}
    assert config["data"]["batch_size"] == 128


@pytest.mark.parametrize("config", CONFIGS)
def test_every_yaml_in_configs_loads(capsys, workdir, config):
    loaded = printed_config(capsys, ["--config", str(REPO / config)])
    overrides = yaml.safe_load(Path(REPO / config).read_text())
    given, printed = flat(overrides), flat(loaded)
    for key, value in given.items():
        if not isinstance(value, list):
            assert str(printed[key]) == str(value), f"{config}: {key}"


def test_recipe_and_strategy_files_stack_later_wins(capsys, workdir):
    config = printed_config(
        capsys,
        ["--config", str(REPO / "configs/recipes/sgd.yaml"), "--config", str(REPO / "configs/strategy/ddp.yaml"),
         "--network", "cnn"],
    )
    assert config["trainer"]["strategy"] == "ddp" and config["model"]["optimizer"]["init_args"]["lr"] == 0.01
    assert config["model"]["network"]["class_path"] == "lightning_modules.networks.SmallCNN"
    assert config["data"]["batch_size"] == 32


def test_help_lists_the_shorthand_flags(capsys, workdir):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    out = capsys.readouterr().out
    assert "--batch_size" in out and "= --data.batch_size" in out and "--trainer.max_epochs" in out


BAD_VALUES = [
    (["--strategy", "foo"], "invalid strategy name"),
    (["--devices", "0"], "devices"),
    (["--accelerator", "tpu"], "torch_xla"),
    (["--num_nodes", "0"], "num_nodes"),
    (["--precision", "7"], "trainer.precision"),
    (["--epochs", "0"], "trainer.max_epochs (--epochs) must be >= 1"),
    (["--epochs", "two"], "trainer.max_epochs"),
    (["--batch_size", "0"], "data.batch_size"),
    (["--lr", "-1"], "--lr must be a number > 0 (the base learning rate, e.g. --lr 0.05); got -1"),
    (["--lr", "nan"], "--lr must be a number > 0"),
    (["--lr", "inf"], "--lr must be a number > 0"),
    (["--optimizer", "adam"], "unknown optimizer 'adam': choose one of adamw, lamb, lars, novograd, sgd, or give a class path"),
    (["--network", "vgg"], "unknown network 'vgg': choose one of cnn, fast_cnn, gpu_cnn, mlp, resnet18, staged_cnn, wrn"),
    (["--lr_scaling", "cubic"], "model.lr_policy.scaling"),
    (["--warmup_epochs", "-1"], "model.lr_policy.warmup_epochs"),
    (["--seed", "abc"], "seed_everything"),
    (["--deterministic", "maybe"], "trainer.deterministic"),
    (["--target_accuracy", "1.5"], "stop_at_target.target_accuracy"),
    (["--patience", "0"], "stop_at_target.patience"),
    (["--lr"], "--lr needs a value"),
    (["--epochs", "2", "--trainer.max_epochs", "3"], "conflicting values"),
    (["--no_such_flag", "1"], "unrecognized arguments"),
    (["--strategy", "fsdp", "--optimizer", "novograd"], "--optimizer novograd keeps a plain tensor beside fsdp's"),
    # Accepted by Lightning or jsonargparse, refused by train.py (fashion_mnist_dp/cli/checks.py, the classifier).
    (["--devices", "-1", "--accelerator", "cpu"], "trainer.devices (--devices) is -1 (every GPU), but the accelerator is cpu"),
    (["--devices", "0,1", "--accelerator", "cpu"], "is '0,1', a list of GPU indices, but the accelerator is cpu"),
    (["--devices", "two"], "trainer.devices (--devices) is 'two': give a number, auto, -1 or a list of GPU indices"),
    (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches is 0: give a whole number >= 1"),
    (["--trainer.accumulate_grad_batches", "-2"], "trainer.accumulate_grad_batches is -2"),
    (["--trainer.val_check_interval", "0"], "trainer.val_check_interval is 0: give a whole number of batches >= 1"),
    (["--trainer.val_check_interval", "1.5"], "You have passed invalid value 1.5 for val_check_interval"),  # Lightning's
    (["--trainer.val_check_interval", "0.0"], "trainer.val_check_interval is 0.0: give a whole number of batches >= 1"),
    (["--trainer.gradient_clip_val", "-1"], "trainer.gradient_clip_val is -1"),
    (["--trainer.check_val_every_n_epoch", "0"], "trainer.check_val_every_n_epoch is 0: give a whole number of epochs "
                                                 ">= 1, or null to validate every trainer.val_check_interval batches"),
    (["--trainer.num_sanity_val_steps", "-5"], "trainer.num_sanity_val_steps is -5: give a number of batches >= 0, or "
                                               "-1 for every validation batch"),
    (["--data.train_subset", "100000000"], "--data.train_subset 100000000 is more than the 256 training images: "
                                           "give at most 256, or leave it unset to train on all (see python"),
    (["--batch_size", "70000"], "--data.batch_size 70000 per device is more than the 256 training images each of the "
                                "1 device(s) gets (256 images over 1): give at most 256"),
    (["--batch_size", "100", "--virtual_devices", "4"], "--data.batch_size 100 per device is more than the 64 training "
                                                        "images each of the 4 device(s) gets"),
    (["--data.train_subset", "257"], "--data.train_subset 257 is more than the 256 training images: give at most 256,"),
    (["--data.train_subset", "193", "--data.val_size", "64"],
     "--data.train_subset 193 is more than the 192 training images after --data.val_size 64 held out: give at most "
     "192, or leave it unset"),
    (["--data.val_seed", "3"], "--data.val_seed 3 chooses the images --data.val_size holds out, and that is 0: give "
                               "--data.val_size N too, or leave it at 0"),
    (["--epochs", "-5"], "trainer.max_epochs (--epochs) must be >= 1, or -1 for no limit; got -5"),
    (["--batch_size", "-3"], "data.batch_size"),
    (["--lr", "0"], "--lr must be a number > 0"),
    (["--warmup_epochs", "inf"], "model.lr_policy.warmup_epochs must be a finite number"),
    (["--model.optimizer.init_args.momentum", "inf"],
     'Parser key "model.optimizer": Parser key "momentum": Expected a <class \'float\'>. Got value: inf.'),
    (["--model.label_smoothing", "2"], "model.label_smoothing must be between 0 and 1"),
    (["--model.optimizer.init_args.momentum", "1.5"], "model.optimizer's momentum must be >= 0 and < 1"),
    (["--model.optimizer.init_args.lr", "-1"], "--model.optimizer.init_args.lr must be a number > 0"),
    (["--model.optimizer.lr", "-1"], "model.optimizer torch.optim.SGD cannot be built: ValueError: Invalid learning rate: -1.0"),
    (["--model.optimizer.init_args.nesterov", "true", "--model.optimizer.init_args.momentum", "0"],
     "model.optimizer torch.optim.SGD cannot be built: ValueError: Nesterov momentum requires a momentum and zero "
     "dampening"),
    (["--optimizer", "adamw", "--model.optimizer.init_args.betas", "[0.9, 1.5]"],
     "model.optimizer torch.optim.AdamW cannot be built: ValueError: Invalid beta parameter at index 1: 1.5"),
    (["--network", "mlp", "--model.network.init_args.hidden", "-3"],
     "model.network lightning_modules.networks.MLP cannot be built: RuntimeError: Trying to create tensor with negative "
     "dimension -3"),
    (["--network", "user_classes.RefusingNet"],
     "model.network user_classes.RefusingNet cannot be built: KeyError: 'no such layer'"),
    (["--optimizer", "user_classes.RefusingOptimizer"],
     "model.optimizer user_classes.RefusingOptimizer cannot be built: ZeroDivisionError: division by zero"),
    (["--trainer.callbacks+=user_classes.RefusingCallback"],
     f"trainer.callbacks.{len(yaml.safe_load(train.DEFAULT_CONFIG.read_text())['trainer']['callbacks'])} "  # appended
     "user_classes.RefusingCallback cannot be built: AssertionError: not today"),
    (["--check_every_n_steps", "0"], "check_every_n_steps"),
    (["--seed", "-1"], "seed_everything (--seed) is -1: give a whole number from 0 to 4294967295, true for a random "
                       "one, or false for none"),
    (["--seed", "99999999999"], "seed_everything (--seed) is 99999999999: give a whole number from 0 to 4294967295"),
    (["--trainer.log_every_n_steps", "-1"], "trainer.log_every_n_steps is -1: give a number of optimizer steps >= 1"),
    (["--trainer.log_every_n_steps", "0"], "trainer.log_every_n_steps is 0: give a number of optimizer steps >= 1"),
    (["--run_name", "a/b"], "--run_name 'a/b' holds a path separator: give a folder name of at most 100 characters"),
    (["--run_name", ".."], "--run_name '..' starts with a dot"),
    (["--run_name", ""], "--run_name '' is empty"),
    (["--run_name", "x" * 101], "is 101 characters long (at most 100)"),
    (["--run_name", "a", "--trainer.logger.init_args.version", "b"], "--run_name a and the logger's version b name "
                                                                      "the run twice"),
    (["--collective_timeout", "0"], "collective_timeout must be a number of seconds > 0; got '0.0' (see python"),
    (["--peak_flops", "-1"], "peak_flops (--peak_flops) is -1.0: give one device's peak FLOP/s, a finite number > 0"),
    (["--peak_flops", "0"], "peak_flops (--peak_flops) is 0.0: give one device's peak FLOP/s"),
    (["--peak_flops", "inf"], 'Parser key "peak_flops"'),  # jsonargparse's: a float it reads is finite
    (["--config", "missing.yaml"], "File does not exist"),
    (["--config", "empty.yaml"], "--config empty.yaml: the file is empty"),
    (["--config", "broken.yaml"], "--config broken.yaml: not valid YAML"),
    (["--config", "text.yaml"], "--config text.yaml: holds a str ('just a sentence')"),
]
# Config files the BAD_VALUES above name, written into the test's working directory.
BAD_CONFIG_FILES = {"empty.yaml": "# only a comment\n", "broken.yaml": "trainer: [devices: 2\n", "text.yaml": "just a sentence\n"}


@pytest.mark.parametrize("args, message", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_value_gives_one_line_and_exit_code_2(capsys, workdir, fashion_root, args, message, monkeypatch):
    for name, text in BAD_CONFIG_FILES.items():
        (workdir / name).write_text(text)
    (workdir / "user_classes.py").write_text(USER_CLASSES)  # a user's own classes whose constructors raise
    monkeypatch.syspath_prepend(str(workdir))
    code = train.main(["--data_dir", str(fashion_root), *args])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert code == 2
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err
    assert not (workdir / "runs").exists()  # nothing written before the mistake was reported


USER_CLASSES = """
import torch
from lightning.pytorch import Callback

class RefusingNet(torch.nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        raise KeyError("no such layer")

class RefusingOptimizer(torch.optim.SGD):
    def __init__(self, params, lr: float = 0.1):
        1 / 0

class RefusingCallback(Callback):
    def __init__(self):
        assert False, "not today"
"""


@pytest.mark.parametrize("keyword, message", [
    ("last", "--ckpt_path last: no run in {folder} has a last checkpoint (last*.ckpt), so there is nothing to resume"),
    ("best", "--ckpt_path best means the best checkpoint of this process's own fit"),
])
def test_checkpoint_keyword_without_a_checkpoint_exits_66(capsys, workdir, fashion_root, keyword, message):
    """Lightning warns and trains from scratch for ``last``, raises a traceback for ``best``."""
    code = train.main(["--data_dir", str(fashion_root), "--ckpt_path", keyword])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    folder = workdir / "runs" / "cnn-auto-batch128-sgd"
    assert code == 66
    assert len(errors) == 1 and message.format(folder=folder) in errors[0], err
    assert not (workdir / "runs").exists()


def test_log_folder_that_is_a_file_exits_73_before_anything_runs(capsys, workdir, fashion_root):
    (workdir / "runs").write_text("not a folder")
    code = train.main(["--data_dir", str(fashion_root)])
    err = capsys.readouterr().err
    assert code == 73
    assert f"train.py: error: trainer.default_root_dir is runs, which cannot be written: " \
        f"{workdir / 'runs'} is a file, not a folder" in err, err
    assert (workdir / "runs").read_text() == "not a folder"




def test_a_mistake_lightning_finds_inside_fit_is_one_line_and_exit_2(capsys, workdir, fashion_root):
    """0.01 of the 1-batch validation loader rounds to zero batches: Lightning raises inside fit."""
    code = train.main(["--data_dir", str(fashion_root), "--network", "mlp", "--trainer.limit_val_batches", "0.01"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert code == 2 and len(errors) == 1 and "limit_val_batches" in errors[0] and "Traceback" not in err, err


def test_val_check_interval_beyond_the_epochs_batches_gives_one_line(capsys, workdir, fashion_root):
    """Lightning's fit loop raises a ValueError once it knows the loader's length (256 images / 128 = 2 batches)."""
    code = train.main(["--data_dir", str(fashion_root), "--network", "mlp", "--epochs", "1",
                       "--trainer.val_check_interval", "5"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert code == 2 and "Traceback" not in err, err
    assert errors == ["train.py: error: trainer.val_check_interval is 5, more than the 2 training batches of an epoch: "
                      "give at most 2, a fraction of the epoch in (0.0, 1.0], or also --trainer.check_val_every_n_epoch "
                      "null to count batches across epochs (see python train.py --help)"], err
