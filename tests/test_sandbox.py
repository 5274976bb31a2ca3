"""Experiment 1 (experiments/sandbox.py): N gloo processes at B/N step like one process at B; f²/N update variance."""

import subprocess
import sys

import pytest

from experiments.sandbox import parse_args
from tests.conftest import REPO


def test_command_line_checks_and_runs_as_a_script():
    with pytest.raises(SystemExit):
        parse_args(["--batch_size", "10", "--world_size", "4"])
    assert parse_args(["--lr_scaling", "sqrt", "--world_size", "4"]).scaled_lr == pytest.approx(2e-3)
    result = subprocess.run([sys.executable, "experiments/sandbox.py", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "--n_experiments" in result.stdout
