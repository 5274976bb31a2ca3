"""The unit tier: no subprocess, no process group; whole runs only in-process on the tiny data (``make test-unit``)."""

import signal
from functools import partial

import pytest
import torch
import yaml
from lightning.pytorch import Trainer

from datamodules import FashionMNISTDataModule
from fashion_mnist_dp.cli.checks import import_class
from fashion_mnist_dp.cli.shorthand import CLASS_NAMES
from lightning_modules import FashionMNISTClassifier, LRPolicy
from fashion_mnist_dp.cli.app import DEFAULT_CONFIG
from fashion_mnist_dp.runtime import VerifiedCheckpointIO, signals


def classifier(network: str = "cnn", lr: float = 0.05, optimizer=torch.optim.SGD, momentum: float = 0.9,
               weight_decay: float = 5e-4, lr_policy: LRPolicy = LRPolicy(), **kwargs) -> FashionMNISTClassifier:
    """configs/default.yaml's model built in Python: ``network`` by its short name (or a module), SGD with momentum
    unless ``optimizer`` says otherwise (then ``momentum`` is not passed)."""
    args = dict(lr=lr, weight_decay=weight_decay, **({"momentum": momentum} if optimizer is torch.optim.SGD else {}))
    net = network if isinstance(network, torch.nn.Module) else import_class(CLASS_NAMES["--model.network"][network])()
    return FashionMNISTClassifier(net, partial(optimizer, **args), lr_policy, **kwargs)


@pytest.fixture
def clean_signals():
    """This process's signal handlers, as they were before the test."""
    handlers = {signum: signal.getsignal(signum) for signum in (*signals.SIGNALS, signals.PEER_FAILED)}
    yield signals
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def with_safety(callbacks=(), check_every_n_steps: int = 50) -> list:
    """``callbacks`` and configs/default.yaml's run-safety owner after them, as the config lists it (so the tests run
    the parts that ship, in their order)."""
    listed = yaml.safe_load(DEFAULT_CONFIG.read_text())["trainer"]["callbacks"]
    (safety,) = [import_class(entry["class_path"]) for entry in listed
                 if entry["class_path"].startswith("fashion_mnist_dp.runtime.")]
    return [*callbacks, safety(check_every_n_steps)]


def tiny_fit(root, folder, callbacks=(), safety=None, batch_size=32, network="mlp", lr=0.05, model_args=None,
             data_args=None, **trainer_args):
    """Fit the mlp on the tiny data (256 images: 8 steps per epoch at batch 32) in this process; returns the trainer.

    ``safety``: a ``check_every_n_steps``: run ``callbacks`` :func:`with_safety`, and checkpoints through
    VerifiedCheckpointIO, as train.py does; ``model_args``: more :func:`classifier` arguments; ``data_args``: more
    FashionMNISTDataModule arguments."""
    settings = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(folder))
    if safety is not None:
        callbacks, settings["plugins"] = with_safety(callbacks, safety), [VerifiedCheckpointIO()]
    settings.update(trainer_args)
    trainer = Trainer(callbacks=list(callbacks), **settings)
    data = FashionMNISTDataModule(data_dir=str(root), batch_size=batch_size, download=False, **(data_args or {}))
    trainer.fit(classifier(network, lr, batch_size=batch_size, **(model_args or {})), datamodule=data)
    return trainer
