"""Exact resume: stopping at an epoch boundary and resuming with --ckpt_path last ends with the same weights, bit for
bit, as the uninterrupted run (one process, CPU, the cnn: dropout draws random numbers every step)."""


import torch

from callbacks.rng_state import capture, restore
from tests.conftest import run_train

TIMEOUT_S = 120


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    state = capture()
    torch.save({"callbacks": {"RngState": state}}, tmp_path / "x.ckpt")
    loaded = torch.load(tmp_path / "x.ckpt", weights_only=True)["callbacks"]["RngState"]  # as LightningCLI reads it
    expected = torch.rand(5)
    restore(loaded)
    assert torch.equal(torch.rand(5), expected)


def test_resume_at_an_epoch_boundary_gives_bitwise_the_uninterrupted_weights(tmp_path, fashion_root):
    args = ["--data_dir", str(fashion_root), "--network", "cnn", "--batch_size", "32", "--test_after_fit", "false"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    resumed.mkdir()
    for cwd, extra in [(straight, ["--epochs", "2"]), (resumed, ["--epochs", "1"]),
                       (resumed, ["--epochs", "2", "--ckpt_path", "last"])]:
        result = run_train(args + extra, cwd=cwd, timeout=TIMEOUT_S)
        assert result.returncode == 0, result.stderr[-3000:]
    assert "Restored all states" in result.stderr and "Epoch 1:" not in result.stdout
    a, b = (torch.load(cwd / "runs" / "fashion_mnist" / "checkpoints" / "last.ckpt", weights_only=False)
            for cwd in (straight, resumed))
    assert a["global_step"] == b["global_step"] == 16
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for state_a, state_b in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert torch.equal(state_a["momentum_buffer"], state_b["momentum_buffer"])
