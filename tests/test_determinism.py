"""Determinism mode: ``--seed S --deterministic true`` twice gives bitwise the same weights and optimizer state and the
same logged metrics on CPU.

Here one process (the cnn: dropout draws random numbers every step). 2 ddp ranks over gloo: tests/test_restarts.py
compares two 2-rank runs of the same seeded command (one clean, one under torchrun with rank 1 killed after each
checkpoint) for bitwise weights and equal metrics; a third 2-rank run here would cost ~15-25 s of the CI budget.
Only the figures that depend on clocks (throughput/*, time/*) or on the process (memory/*) may differ.
"""

import torch

from tests.seeded_runs import DETERMINISTIC_TAGS


def assert_same_state(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] > 0
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    states_a, states_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert states_a.keys() == states_b.keys() and states_a
    for index, state in states_a.items():
        for name, value in state.items():
            assert torch.equal(value, states_b[index][name]), (index, name)


def assert_same_metrics(a: dict, b: dict) -> None:
    for tag in DETERMINISTIC_TAGS:
        assert a.get(tag), f"{tag} not logged: {sorted(a)}"
        assert a[tag] == b[tag], tag  # every (step, value), exactly
    assert a.keys() == b.keys()


def test_two_seeded_deterministic_runs_end_bitwise_equal(seeded_runs):
    first, second = seeded_runs.get("single", 0), seeded_runs.get("single", 1)
    assert_same_state(first.checkpoint, second.checkpoint)
    assert_same_metrics(first.scalars, second.scalars)

