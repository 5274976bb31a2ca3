"""A user's own network and optimizer, named by class path in YAML, train with no change to the project: the files of
docs/cli.md ("Your own network or optimizer"), run as written there."""

import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from callbacks.run_record import read_epochs
from tests.conftest import REPO, experiment_dir, run_dir, run_train

FENCED = re.compile(r"^```(?:python|yaml)\n# (\S+)(.*?)^```$", re.M | re.S)


def documented_files(folder: Path) -> dict:
    """Every fenced block of docs/cli.md and docs/architecture.md whose first line is ``# <file name>``, written into
    ``folder``; a file both pages show must read the same on both."""
    written, texts = {}, {}
    for page in ("cli.md", "architecture.md"):
        for name, body in FENCED.findall((REPO / "docs" / page).read_text()):
            name = name.rstrip(":")
            assert texts.setdefault(name, body) == body, f"docs disagree on {name}"
            (folder / name).write_text(f"# {name}{body}")
            written[name] = folder / name
    return written


@pytest.fixture
def docs_files(workdir):
    files = documented_files(workdir)
    assert {"rmsprop.yaml", "my_networks.py", "lenet.yaml"} <= set(files), sorted(files)
    return files


TINY = ["--batch_size", "32", "--epochs", "1", "--test_after_fit", "false"]


def test_an_optimizer_with_arguments_of_its_own_trains_from_yaml_at_the_scaled_lr(workdir, fashion_root, docs_files):
    result = run_train(["--config", str(docs_files["rmsprop.yaml"]), "--data_dir", str(fashion_root), *TINY,
                        "--network", "mlp", "--model.lr_policy.base_batch_size", "16"], cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "learning rate   : base 0.001 at batch 16 -> 0.002 (linear scaling)" in result.stdout + result.stderr, result.stdout
    assert "optimizer       : RMSprop, weight decay 0 (not on biases and norm weights)" in result.stdout + result.stderr
    saved = torch.load(run_dir(workdir) / "checkpoints" / "last.ckpt", weights_only=True)
    groups = saved["optimizer_states"][0]["param_groups"]
    assert [g["alpha"] for g in groups] == [0.9, 0.9] and {g["initial_lr"] for g in groups} == {0.002}
    assert experiment_dir(workdir).name == "mlp-auto-batch32-rmsprop"  # the experiment is named by what ran


def test_a_network_from_a_module_outside_the_project_trains_from_yaml(workdir, fashion_root, docs_files):
    env = {"PYTHONPATH": str(workdir)}
    result = run_train(["--config", str(docs_files["lenet.yaml"]), "--data_dir", str(fashion_root), *TINY],
                       cwd=workdir, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "network         : LeNet" in result.stdout + result.stderr
    run = run_dir(workdir)
    assert run.parent.name == "lenet-auto-batch32-sgd" and read_epochs(run)[0].val_acc is not None
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    assert hparams["network"] == {"class_path": "my_networks.LeNet", "init_args": {"num_classes": 10, "width": 8}}
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["state_dict"]["net.0.weight"].shape == (8, 1, 5, 5)  # width 8 from the YAML
    # The checkpoint names the class, and its module is imported only when the user names it again.
    tested = run_train(["test", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--data_dir",
                        str(fashion_root)], cwd=workdir, env=env)
    assert tested.returncode == 66 and "names model.network my_networks.LeNet, a class from a module this run has " \
        "not imported" in tested.stderr and "Traceback" not in tested.stderr, tested.stderr[-2000:]
    tested = run_train(["test", "--config", str(docs_files["lenet.yaml"]), "--ckpt_path",
                        str(run / "checkpoints" / "last.ckpt"), "--data_dir", str(fashion_root)], cwd=workdir, env=env)
    assert tested.returncode == 0 and "test/acc" in tested.stdout, tested.stderr[-2000:]


def test_a_bad_init_arg_of_a_network_is_one_line(workdir, fashion_root, docs_files):
    result = run_train(["--config", str(docs_files["lenet.yaml"]), "--data_dir", str(fashion_root),
                        "--model.network.init_args.width", "six"], cwd=workdir, env={"PYTHONPATH": str(workdir)})
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert result.returncode == 2 and len(errors) == 1 and "width" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (workdir / "runs").exists()


def test_a_checkpoint_never_makes_a_run_import_a_module_it_names(workdir, fashion_root):
    """A crafted checkpoint that names a class of an importable module with a side effect: refused (exit 66), the
    module never imported."""
    evil = workdir / "evil"
    evil.mkdir()
    marker = workdir / "imported"
    (evil / "side_effect.py").write_text(f"open({str(marker)!r}, 'w').close()\nfrom torch.nn import Linear as Net\n")
    trained = run_train(["--data_dir", str(fashion_root), "--network", "mlp", *TINY], cwd=workdir)
    assert trained.returncode == 0, trained.stderr[-2000:]
    last = run_dir(workdir) / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["hyper_parameters"]["network"] = {"class_path": "side_effect.Net", "init_args": {}}
    crafted = workdir / "crafted.ckpt"
    torch.save(checkpoint, crafted)
    result = run_train(["test", "--ckpt_path", str(crafted), "--data_dir", str(fashion_root)], cwd=workdir,
                       env={"PYTHONPATH": os.pathsep.join([str(evil)])})
    assert result.returncode == 66 and "side_effect.Net" in result.stderr, result.stderr[-2000:]
    assert not marker.exists() and "Traceback" not in result.stderr


CONTRACT_BREAKERS = '''
import torch
from torch import nn


class FiveWay(nn.Module):
    """Returns 5 logits, not 10."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 5)

    def forward(self, x):
        return self.fc(x.flatten(1))


class NeedsClosure(torch.optim.SGD):
    """An optimizer whose step must evaluate the loss itself."""

    def step(self, closure):
        return super().step(closure)
'''
CONTRACT = "a network must take [B, 1, 28, 28] images and return [B, 10] logits"


@pytest.mark.multiprocess  # the fsdp case names 2 devices; the check ends it before any rank starts
@pytest.mark.parametrize("args, expected", [
    (["--model.network", "breakers.FiveWay"],
     f"model.network breakers.FiveWay returned [2, 5] for a batch of [2, 1, 28, 28] images: {CONTRACT}"),
    (["--model.network", "breakers.FiveWay", "--strategy", "fsdp", "--devices", "2", "--accelerator", "cpu"],
     f"model.network breakers.FiveWay returned [2, 5] for a batch of [2, 1, 28, 28] images: {CONTRACT}"),
    (["--model.network", "torchvision.models.resnet18"],
     "model.network torchvision.models.resnet.ResNet cannot take a batch of [2, 1, 28, 28] images (RuntimeError: "
     "Given groups=1, weight of size [64, 3, 7, 7], expected input[2, 1, 28, 28] to have 3 channels"),
    (["--optimizer", "torch.optim.LBFGS"],
     "model.optimizer torch.optim.lbfgs.LBFGS refuses parameter groups (LBFGS doesn't support per-parameter options "
     "(parameter groups)), which the classifier needs (no weight decay on biases and norm weights): use one that "
     "takes them, e.g. torch.optim.SGD, torch.optim.AdamW, torch.optim.RAdam"),
    (["--optimizer", "breakers.NeedsClosure", "--model.optimizer.init_args.lr", "0.1"],
     "model.optimizer breakers.NeedsClosure needs a closure in every step"),
], ids=["wrong-output", "wrong-output-fsdp-2-ranks", "three-channel-network", "lbfgs", "needs-a-closure"])
def test_a_network_or_optimizer_that_breaks_the_contract_ends_in_one_line(workdir, fashion_root, args, expected):
    (workdir / "breakers.py").write_text(CONTRACT_BREAKERS)
    result = run_train(["--data_dir", str(fashion_root), *TINY, *args], cwd=workdir,
                       env={"PYTHONPATH": str(workdir)})
    lines = [line for line in result.stderr.splitlines() if line.startswith("train.py:")]
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not (workdir / "runs").exists()
