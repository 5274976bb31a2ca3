"""The workshop-style command line is rewritten to LightningCLI's keys, and nothing else changes."""

import pytest

from fashion_mnist_dp.cli.shorthand import CLASS_NAMES, CONFIGS, SHORTHAND, expand_args, find_subcommand
from fashion_mnist_dp.runtime.errors import ConfigError
from tests.unit.test_cli import printed_config


def test_no_subcommand_means_fit_and_shorthand_maps_to_full_keys():
    assert expand_args(["--strategy", "ddp", "--devices", "4"]) == [
        "fit",
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "4",
    ]


def test_every_documented_shorthand_is_rewritten_with_equals_form_too():
    for short, full in SHORTHAND.items():
        value = {"--optimizer": "my.Optimizer", "--network": "my.Net"}.get(short, "7")
        assert expand_args([f"{short}={value}"]) == ["fit", full, value]


def test_short_names_load_their_config_files_and_unknown_ones_name_the_choices():
    assert expand_args(["--network", "fast_cnn", "--model.optimizer", "lamb"]) == [
        "fit", "--config", str(CONFIGS / "networks" / "fast_cnn.yaml"), "--config",
        str(CONFIGS / "optimizers" / "lamb.yaml")]
    assert CLASS_NAMES["--model.network"]["fast_cnn"] == "lightning_modules.networks.FastCNN"
    assert CLASS_NAMES["--model.optimizer"]["lamb"] == "torch_optimizer.Lamb"
    assert expand_args(["--network=my_package.Net"]) == ["fit", "--model.network", "my_package.Net"]
    with pytest.raises(ConfigError, match="unknown network 'vgg': choose one of cnn, fast_cnn, gpu_cnn, mlp, resnet18, "
                                          "staged_cnn, wrn, or give a class path"):
        expand_args(["--network", "vgg"])


def lr_and_class(capsys, *args):
    """The optimizer's class and base lr as the command line leaves them, parsed (--print_config)."""
    optimizer = printed_config(capsys, list(args))["model"]["optimizer"]
    return optimizer["class_path"].rpartition(".")[2], optimizer["init_args"]["lr"]


def test_a_shipped_optimizer_comes_with_its_known_good_lr_unless_an_lr_is_given(capsys, workdir):
    assert lr_and_class(capsys, "--optimizer", "adamw", "--epochs", "1") == ("AdamW", 0.001)
    assert lr_and_class(capsys, "--lr", "0.01", "--optimizer", "adamw") == ("AdamW", 0.01)  # given first: still wins
    assert lr_and_class(capsys, "--optimizer", "adamw", "--model.optimizer.init_args.lr=0.02") == ("AdamW", 0.02)
    assert lr_and_class(capsys, "--optimizer", "lamb") == ("Lamb", 0.005)
    assert expand_args(["--optimizer", "my.Optimizer"]) == ["fit", "--model.optimizer", "my.Optimizer"]
    assert expand_args(["--optimizer", "adamw"]).lr_origin == (
        "--optimizer adamw (configs/optimizers/adamw.yaml) (--lr sets another)")


def test_a_shipped_network_brings_its_lr_and_flags_after_it_win(capsys, workdir):
    assert lr_and_class(capsys, "--network", "wrn") == ("SGD", 0.005)
    assert lr_and_class(capsys, "--network", "wrn", "--optimizer", "sgd") == ("SGD", 0.05)  # the optimizer's, after
    assert lr_and_class(capsys, "--network", "wrn", "--optimizer", "adamw") == ("AdamW", 0.001)
    assert lr_and_class(capsys, "--network", "wrn", "--lr", "0.02") == ("SGD", 0.02)
    assert expand_args(["--network", "wrn", "--lr", "0.02"]).lr_origin == "--lr 0.02"
    assert lr_and_class(capsys, "--network", "cnn") == ("SGD", 0.05)
    assert expand_args(["--epochs", "1"]).lr_origin is None  # from the config files


def test_explicit_subcommand_and_full_keys_are_left_alone():
    args = ["test", "--ckpt_path", "last", "--trainer.max_epochs", "2", "--config", "a.yaml"]
    assert expand_args(args) == args


def test_a_subcommand_name_given_as_a_value_is_not_a_subcommand():
    assert find_subcommand(["--data.data_dir", "test"]) is None
    assert expand_args(["--data_dir", "test"]) == ["fit", "--data.data_dir", "test"]
    assert find_subcommand(["--config", "x.yaml", "validate"]) == "validate"


def test_same_key_twice_later_wins_as_in_lightningcli():
    assert expand_args(["--epochs", "2", "--epochs", "3"]) == ["fit", "--trainer.max_epochs", "2", "--trainer.max_epochs", "3"]


def test_shorthand_and_full_key_agreeing_is_fine_disagreeing_is_an_error():
    expand_args(["--epochs", "2", "--trainer.max_epochs", "2"])
    with pytest.raises(ConfigError, match=r"conflicting values for trainer.max_epochs: --epochs 2 and --trainer.max_epochs 3"):
        expand_args(["--epochs", "2", "--trainer.max_epochs", "3"])


def test_shorthand_without_value_says_what_to_give():
    with pytest.raises(ConfigError, match=r"--lr needs a value, e.g. --lr 0.05"):
        expand_args(["--lr"])
    with pytest.raises(ConfigError, match=r"--devices needs a value"):
        expand_args(["--devices", "--strategy", "ddp"])
