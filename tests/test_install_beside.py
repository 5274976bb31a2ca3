"""``pip install -e .`` into an environment that already holds a supported torch keeps that torch (README, "Set-up"):
make test-oldest installs torch and torchvision first, as a cluster's image has them, writes their versions down, then
installs the project beside them with its other floors (Makefile, $(OLDEST_STAMP))."""

import importlib.metadata
import sys
from pathlib import Path

import pytest

BEFORE = Path(sys.prefix) / "torch-before-project.txt"  # torch==X and torchvision==Y, before the project went in


@pytest.mark.oldest
@pytest.mark.skipif(not BEFORE.is_file(), reason="only in make test-oldest's venv, which installs torch before the "
                                                 "project")
def test_installing_the_project_beside_a_supported_torch_keeps_that_torch_and_torchvision():
    before = dict(line.split("==") for line in BEFORE.read_text().split())
    assert sorted(before) == ["torch", "torchvision"]
    assert {name: importlib.metadata.version(name) for name in before} == before
