"""The workshop-style command line is rewritten to LightningCLI's keys, and nothing else changes."""

import pytest

from fashion_mnist_dp.cli.shorthand import (CLASS_NAMES, KNOWN_GOOD_LR, NETWORK_LR, SHORTHAND, expand_args,
                                            find_subcommand)
from fashion_mnist_dp.runtime.errors import ConfigError


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


def test_short_names_stand_for_class_paths_and_unknown_ones_name_the_choices():
    assert expand_args(["--network", "fast_cnn", "--model.optimizer", "lamb"]) == [
        "fit", "--model.network", "lightning_modules.networks.FastCNN", "--model.optimizer", "torch_optimizer.Lamb",
        "--model.optimizer.init_args.lr", KNOWN_GOOD_LR["lamb"]]
    assert expand_args(["--network=my_package.Net"]) == ["fit", "--model.network", "my_package.Net"]
    with pytest.raises(ConfigError, match="unknown network 'vgg': choose one of cnn, fast_cnn, staged_cnn, gpu_cnn, mlp, wrn, "
                                             "resnet18, or give a class path"):
        expand_args(["--network", "vgg"])


def test_a_shipped_optimizer_comes_with_its_known_good_lr_unless_an_lr_is_given():
    lr = "--model.optimizer.init_args.lr"
    assert expand_args(["--optimizer", "adamw", "--epochs", "1"]) == [
        "fit", "--model.optimizer", "torch.optim.AdamW", lr, "0.001", "--trainer.max_epochs", "1"]
    assert expand_args(["--optimizer", "torch.optim.AdamW"])[-2:] == [lr, "0.001"]  # its class path too
    assert expand_args(["--lr", "0.01", "--optimizer", "adamw"]) == ["fit", lr, "0.01", "--model.optimizer",
                                                                    "torch.optim.AdamW"]
    assert expand_args(["--optimizer", "adamw", f"{lr}=0.02"]) == ["fit", "--model.optimizer", "torch.optim.AdamW",
                                                                   lr, "0.02"]
    assert expand_args(["--optimizer", "my.Optimizer"]) == ["fit", "--model.optimizer", "my.Optimizer"]
    assert set(KNOWN_GOOD_LR) == set(CLASS_NAMES["--model.optimizer"])


def test_a_shipped_network_brings_its_lr_over_the_optimizers_and_under_the_users():
    lr, wrn = "--model.optimizer.init_args.lr", "lightning_modules.networks.WideResNet"
    expanded = expand_args(["--network", "wrn"])
    assert expanded == ["fit", "--model.network", wrn, lr, NETWORK_LR[("wrn", "sgd")]]
    assert expanded.lr_origin == "wrn's known-good lr with sgd (--lr sets another)"
    assert expand_args(["--network", "wrn", "--optimizer", "sgd"])[-2:] == [lr, NETWORK_LR[("wrn", "sgd")]]
    assert expand_args(["--network", "wrn", "--optimizer", "adamw"])[-2:] == [lr, KNOWN_GOOD_LR["adamw"]]  # no pair
    given = expand_args(["--network", "wrn", "--lr", "0.02"])
    assert given == ["fit", "--model.network", wrn, lr, "0.02"] and given.lr_origin == "--lr 0.02"
    assert expand_args(["--network", "cnn"]) == ["fit", "--model.network", "lightning_modules.networks.SmallCNN"]
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
