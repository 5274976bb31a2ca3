"""The experiment stands alone: lightning_modules/ and datamodules/, copied into an empty folder with a YAML of their
own, fit with a plain LightningCLI, and neither imports the harness (docs/architecture.md)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import REPO

EXPERIMENT = ("lightning_modules", "datamodules")
HARNESS = ("cli", "runtime", "strategies", "callbacks", "train", "fashion_mnist_dp", "benchmarks", "experiments")

# A plain LightningCLI, with every harness package made unimportable (the editable install would find them anywhere).
PLAIN_CLI = f"""
import sys
from importlib.abc import MetaPathFinder

class NoHarness(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HARNESS!r}:
            raise ImportError(f"the experiment imported the harness: {{name}}")
        return None

sys.meta_path.insert(0, NoHarness())
from lightning.pytorch.cli import LightningCLI
from datamodules import FashionMNISTDataModule
from lightning_modules import FashionMNISTClassifier
LightningCLI(FashionMNISTClassifier, FashionMNISTDataModule)
"""

CONFIG = """\
trainer: {max_steps: 2, accelerator: cpu, devices: 1, logger: false, enable_progress_bar: false, limit_val_batches: 1}
model:
  network: {class_path: lightning_modules.networks.SmallCNN}
  optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.05, momentum: 0.9}}
  batch_size: 32
data: {batch_size: 32, download: false}
"""


def imported_packages(folder: Path) -> set:
    names = set()
    for source in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_the_model_and_the_data_import_no_harness_module():
    for package in EXPERIMENT:
        assert not imported_packages(REPO / package) & set(HARNESS), package


def test_a_copy_of_the_model_and_the_data_fits_two_steps_with_a_plain_lightning_cli(tmp_path, fashion_root):
    for package in EXPERIMENT:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "plain.yaml").write_text(CONFIG)
    (tmp_path / "main.py").write_text(PLAIN_CLI)
    result = subprocess.run([sys.executable, "main.py", "fit", "--config", "plain.yaml", "--data.data_dir",
                             str(fashion_root), "--trainer.default_root_dir", "out",
                             "--trainer.callbacks+=ModelCheckpoint"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = next((tmp_path / "out").rglob("*.ckpt"))
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["global_step"] == 2
    assert saved["hyper_parameters"]["network"]["class_path"] == "lightning_modules.networks.SmallCNN"
