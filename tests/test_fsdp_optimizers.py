"""LAMB and LARS under ``--strategy fsdp`` (FSDP2): each rank holds half of every layer, yet they train as under ddp.
Not in the strategy_runs group of tests/conftest.py (its runs are its own), so a second pytest worker can run it."""

import pytest

from tests.conftest import FSDP_ON_CPU

pytestmark = [pytest.mark.multiprocess, FSDP_ON_CPU]


@pytest.mark.parametrize("optimizer, lr", [("lamb", "0.01"), ("lars", "0.05")])
def test_layerwise_optimizers_train_under_fsdp_as_under_ddp(strategy_runs, optimizer, lr):
    """Each rank holds half of every layer, yet the trust ratios use whole-layer norms (DTensor reduces them): the
    weights after 8 steps equal ddp's up to float rounding. With 32 held-out images the test after fit also
    reloads the best checkpoint into the sharded model."""
    flags = ("--devices", "2", "--batch_size", "16", "--optimizer", optimizer, "--lr", lr, "--data.val_size", "32")
    sharded = strategy_runs.get("--strategy", "fsdp", *flags, "--test_after_fit", "true")
    replicated = strategy_runs.get("--strategy", "ddp", *flags)
    assert sharded.distance(replicated) < 1e-5 and sharded.moved() > 1e-3
    assert "Restoring states from the checkpoint path" in sharded.output and "test/acc" in sharded.output
