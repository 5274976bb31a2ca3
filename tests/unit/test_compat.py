"""Every private Lightning attribute we rely on is in fashion_mnist_dp/runtime/compat.py, and is still there in the installed Lightning."""

import ast
from pathlib import Path

import lightning
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from fashion_mnist_dp.runtime import compat

REPO = Path(__file__).resolve().parents[2]
SOURCE = [p for folder in ("fashion_mnist_dp", "callbacks", "datamodules", "lightning_modules")
          for p in (REPO / folder).rglob("*.py")] + [REPO / "train.py"]
# Hooks of Lightning's strategy classes that fashion_mnist_dp/strategies/ overrides, and may call on super().
OVERRIDDEN_HOOKS = {"_configure_launcher"}


def test_every_private_attribute_relied_on_is_still_there():
    gone = compat.missing()
    assert gone == [], (f"Lightning {lightning.__version__} no longer has {', '.join(gone)} (fashion_mnist_dp/runtime/compat.py was "
                        f"checked against {compat.CHECKED_AGAINST}): adapt fashion_mnist_dp/runtime/compat.py")


def test_a_removed_attribute_is_named(monkeypatch):
    monkeypatch.delattr(ModelCheckpoint, "_save_checkpoint")  # not ours: only the naming is tested
    monkeypatch.setattr(compat, "_required", lambda: [(ModelCheckpoint, "_save_checkpoint")])
    assert compat.missing() == ["ModelCheckpoint._save_checkpoint"]


def test_no_other_module_touches_them():
    """The private names compat relies on appear in no other source module (but the strategies' own hooks)."""
    names = {name for _, name in compat._required()} - OVERRIDDEN_HOOKS
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
