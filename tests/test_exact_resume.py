"""Exact resume: a run stopped at an epoch boundary, or by SIGTERM in the middle of an epoch, and resumed with
--ckpt_path last ends with the same weights, bit for bit, as the uninterrupted run (CPU, same seed, same world size).

One process: the cnn (dropout draws from torch's generator every step) with random crop and flip (drawn per
(seed, rank, epoch, batch)). Two ddp processes over gloo: the mlp, whose images carry their index, so the test
also sees which samples each rank trained on before and after the stop.
"""

import json

import pytest
import torch

from callbacks.rng_state import capture, restore
from tests.conftest import TRAIN_PY, run_train
from tests.processes import clean_env, running_in, start_all, wait_all

TIMEOUT_S = 120
PREEMPTED = 143
ONE_PROCESS = ["--network", "cnn", "--batch_size", "32", "--test_after_fit", "false",
               "--data.random_crop_padding", "2", "--data.horizontal_flip", "true"]
STEPS_PER_EPOCH = 8  # 256 images / 32


def last_checkpoint(cwd):
    return torch.load(cwd / "runs" / "fashion_mnist" / "checkpoints" / "last.ckpt", weights_only=False)


def assert_bitwise_equal(a: dict, b: dict) -> None:
    """Every weight, buffer and momentum buffer ``torch.equal``, and the same step."""
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    states_a, states_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert states_a.keys() == states_b.keys()
    for index, state in states_a.items():
        assert torch.equal(state["momentum_buffer"], states_b[index]["momentum_buffer"]), index


def loader_position(checkpoint: dict) -> dict:
    """Where the training data loader stood when the checkpoint was written (datamodules/resumable.py)."""
    (state,) = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    return state


@pytest.fixture(scope="module")
def straight(tmp_path_factory, fashion_root):
    """The uninterrupted one-process run: 2 epochs."""
    cwd = tmp_path_factory.mktemp("straight")
    result = run_train(["--data_dir", str(fashion_root), *ONE_PROCESS, "--epochs", "2"], cwd=cwd, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return last_checkpoint(cwd)


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    state = capture()
    torch.save({"callbacks": {"RngState": state}}, tmp_path / "x.ckpt")
    loaded = torch.load(tmp_path / "x.ckpt", weights_only=True)["callbacks"]["RngState"]  # as LightningCLI reads it
    expected = torch.rand(5)
    restore(loaded)
    assert torch.equal(torch.rand(5), expected)


def test_resume_at_an_epoch_boundary_gives_bitwise_the_uninterrupted_weights(tmp_path, fashion_root, straight):
    args = ["--data_dir", str(fashion_root), *ONE_PROCESS]
    for extra in (["--epochs", "1"], ["--epochs", "2", "--ckpt_path", "last"]):
        result = run_train(args + extra, cwd=tmp_path, timeout=TIMEOUT_S)
        assert result.returncode == 0, result.stderr[-3000:]
    assert "Restored all states" in result.stderr and "Epoch 1:" not in result.stdout
    resumed = last_checkpoint(tmp_path)
    assert resumed["global_step"] == 2 * STEPS_PER_EPOCH
    assert_bitwise_equal(straight, resumed)


def test_sigterm_mid_epoch_then_resume_gives_bitwise_the_uninterrupted_weights(tmp_path, fashion_root, straight):
    """SIGTERM after step 3 of epoch 1's 8: last.ckpt holds the loader's position (epoch 0, 3 batches); the resumed
    run trains batches 4-8 of epoch 1 (not 1-5 again, as Lightning's non-resumable loader did), then epoch 2."""
    args = ["--data_dir", str(fashion_root), *ONE_PROCESS, "--epochs", "2"]
    stopped = run_train(args + ["--trainer.callbacks+=tests.recorder.SignalAt", "--trainer.callbacks.step=3"],
                        cwd=tmp_path, timeout=TIMEOUT_S)
    assert stopped.returncode == PREEMPTED, stopped.stderr[-3000:]
    checkpoint = last_checkpoint(tmp_path)
    assert checkpoint["global_step"] == 3 and checkpoint["epoch"] == 0
    assert loader_position(checkpoint) == {"epoch": 0, "batches": 3, "batch_size": 32, "world_size": 1}

    resumed = run_train(args + ["--ckpt_path", "last"], cwd=tmp_path, timeout=TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "dataloader is not resumable" not in resumed.stderr  # Lightning's warning for a loader without state
    assert_bitwise_equal(straight, last_checkpoint(tmp_path))


@pytest.mark.multiprocess
def test_two_ddp_ranks_stopped_mid_epoch_resume_exactly_where_they_stopped(tmp_path, fashion_root):
    """2 gloo ranks × batch 32: 4 steps per epoch, 3 epochs. SIGTERM to rank 0 after step 6 (batch 2 of epoch 2).
    Each rank's epoch-2 samples before the stop plus those after the resume are exactly its uninterrupted epoch-2
    samples, in order (none twice, none missing); the final weights of both ranks are bitwise the uninterrupted ones.
    """
    def command(name, *extra):
        record = tmp_path / name / "record"
        record.mkdir(parents=True, exist_ok=True)
        argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--network", "mlp",
                "--data_dir", str(fashion_root), "--batch_size", "32", "--epochs", "3", "--test_after_fit", "false",
                "--trainer.callbacks+=tests.recorder.SampleRecorder", "--trainer.callbacks+=tests.recorder.RankWeights",
                *extra]
        return name, argv, record.parent, clean_env({"SAMPLE_RECORD_DIR": str(record)})

    def samples(name):
        return [json.loads((tmp_path / name / "record" / f"rank{r}.json").read_text())["train"] for r in (0, 1)]

    # The uninterrupted run and the one that is stopped run side by side (one CPU each on the 2-core machine).
    straight_job, stopped_job = jobs = start_all(
        [command("straight"), command("resumed", "--trainer.callbacks+=tests.recorder.SignalAt",
                                      "--trainer.callbacks.step=6")], tmp_path / "logs")
    assert wait_all(jobs, TIMEOUT_S) is None
    assert straight_job.returncode == 0, straight_job.tail()
    assert stopped_job.returncode == PREEMPTED, stopped_job.tail()
    checkpoint = last_checkpoint(tmp_path / "resumed")
    assert checkpoint["global_step"] == 6
    assert loader_position(checkpoint) == {"epoch": 1, "batches": 2, "batch_size": 32, "world_size": 2}
    before = samples("resumed")

    (resumed_job,) = start_all([command("resumed", "--ckpt_path", "last")], tmp_path / "logs2")
    assert wait_all([resumed_job], TIMEOUT_S) is None
    assert resumed_job.returncode == 0, resumed_job.tail()
    assert running_in(tmp_path / "resumed") == [] and running_in(tmp_path / "straight") == []

    after, uninterrupted = samples("resumed"), samples("straight")
    for rank in (0, 1):
        assert len(before[rank]["1"]) == 2 * 32
        assert before[rank]["1"] + after[rank]["1"] == uninterrupted[rank]["1"], f"rank {rank}, epoch 2"
        assert after[rank]["2"] == uninterrupted[rank]["2"], f"rank {rank}, epoch 3"
        assert "0" not in after[rank]
    assert_bitwise_equal(last_checkpoint(tmp_path / "straight"), last_checkpoint(tmp_path / "resumed"))
    for rank in (0, 1):  # what each rank holds, not only what rank 0 saved
        a, b = (torch.load(tmp_path / name / "record" / f"rank_weights{rank}.pt") for name in ("straight", "resumed"))
        assert all(torch.equal(a[key], b[key]) for key in a), f"rank {rank}"
