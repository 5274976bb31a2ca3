"""Exact resume: a run stopped at an epoch boundary, or by SIGTERM in the middle of an epoch, and resumed with
--ckpt_path last ends with the same weights, bit for bit, as the uninterrupted run (CPU, same seed, same world size).

The cnn (dropout draws from torch's generator every step). One process: with random crop and flip (drawn per
(seed, rank, epoch, batch)). Two ddp processes over gloo: without augmentation, so the images still carry their
index and the test also sees which samples each rank trained on before and after the stop. The loader's position
(datamodules/resumable.py) is also tested alone, without training.
"""

import json

import pytest
import torch

from benchmarks.launch import clean_env, running_in, start_all, wait_all
from tests.conftest import TRAIN_PY, run_train, experiment_dir, run_dir

TIMEOUT_S = 120
PREEMPTED = 143
STEPS_PER_EPOCH = 8  # 256 images / 32
AUGMENTED_CNN = ["--network", "cnn", "--batch_size", "32", "--test_after_fit", "false",
                 "--data.random_crop_padding", "2", "--data.horizontal_flip", "true"]
# Every run also keeps each epoch's checkpoint (every_epoch/epoch=N.ckpt), to compare stages of a resumed run
# (mode max only gives this ModelCheckpoint a state key other than last.ckpt's: neither monitors a metric).
ONE_PROCESS = [*AUGMENTED_CNN, "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
               "--trainer.callbacks.dirpath=every_epoch", "--trainer.callbacks.filename={epoch}",
               "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.mode=max"]


def last_checkpoint(cwd):
    return torch.load(run_dir(cwd) / "checkpoints" / "last.ckpt", weights_only=False)


def epoch_checkpoint(cwd, epoch: int):
    return torch.load(cwd / "every_epoch" / f"epoch={epoch - 1}.ckpt", weights_only=False)


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
    """Where the training loader stood when the checkpoint was written, as the data module saved it (what a resume
    restores) and as Lightning's fit loop saved it (the loader's own state)."""
    position = checkpoint["FashionMNISTDataModule"]["train_position"]
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [position]
    return position


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, fashion_root):
    """2 epochs straight; and SIGTERM after step 3 of epoch 1's 8, resumed to the end of epoch 1 (--epochs 1), then
    resumed again to the end of epoch 2: a mid-epoch and an epoch-boundary resume in one chain of runs."""
    straight, resumed = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("resumed")
    args = ["--data_dir", str(fashion_root), *ONE_PROCESS]
    runs = {}
    for name, cwd, extra in [
        ("straight", straight, ["--epochs", "2"]),
        ("stopped", resumed, ["--epochs", "2", "--check_every_n_steps", "3",
                              "--trainer.callbacks+=tests.recorder.SignalAt", "--trainer.callbacks.step=3"]),
        ("mid_epoch", resumed, ["--epochs", "1", "--ckpt_path", "last"]),
        ("boundary", resumed, ["--epochs", "2", "--ckpt_path", "last"]),
    ]:
        runs[name] = run_train(args + extra, cwd=cwd, timeout=TIMEOUT_S)
        if name == "stopped":
            assert runs[name].returncode == PREEMPTED, runs[name].stderr[-3000:]
            runs["stop_checkpoint"] = last_checkpoint(resumed)
        else:
            assert runs[name].returncode == 0, (name, runs[name].stderr[-3000:])
    return straight, resumed, runs
















def test_sigterm_mid_epoch_then_resume_gives_bitwise_the_uninterrupted_weights(one_process):
    """last.ckpt of the stop holds the loader's position (epoch 0, 3 batches); the resumed run trains batches 4-8 of
    epoch 1 (Lightning's plain loader trained 1-5 again) and ends epoch 1 with the uninterrupted run's weights."""
    straight, resumed, runs = one_process
    checkpoint = runs["stop_checkpoint"]
    assert checkpoint["global_step"] == 3 and checkpoint["epoch"] == 0
    assert loader_position(checkpoint) == {"epoch": 0, "batches": 3, "batch_size": 32, "world_size": 1}
    log = runs["mid_epoch"].stderr
    assert "Restored all states" in log
    assert "not resumable" not in log and "DataPositionWarning" not in log, log[-3000:]
    assert_bitwise_equal(epoch_checkpoint(straight, 1), epoch_checkpoint(resumed, 1))


def test_resume_at_an_epoch_boundary_gives_bitwise_the_uninterrupted_weights(one_process):
    straight, resumed, runs = one_process
    assert "Restored all states" in runs["boundary"].stderr and "Epoch 1:" not in runs["boundary"].stdout
    final = last_checkpoint(resumed)
    assert final["global_step"] == 2 * STEPS_PER_EPOCH
    assert_bitwise_equal(last_checkpoint(straight), final)
    assert_bitwise_equal(epoch_checkpoint(straight, 2), final)


@pytest.mark.multiprocess
def test_two_ddp_ranks_stopped_mid_epoch_resume_exactly_where_they_stopped(tmp_path, fashion_root):
    """2 gloo ranks × batch 32: 4 steps per epoch, 3 epochs, deciding every 3 steps. SIGTERM to rank 0 just before
    step 5: both stop at the next decision, after step 6 (batch 2 of epoch 2).
    Each rank's epoch-2 samples before the stop plus those after the resume are exactly its uninterrupted epoch-2
    samples, in order (none twice, none missing); the final weights of both ranks are bitwise the uninterrupted ones
    (so rank 0's generator state, restored on every rank, is every rank's: all are seeded and draw alike).
    """
    def command(name, *extra):
        record = tmp_path / name / "record"
        record.mkdir(parents=True, exist_ok=True)
        argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--network", "cnn",
                "--data_dir", str(fashion_root), "--batch_size", "32", "--epochs", "3", "--test_after_fit", "false",
                "--trainer.callbacks+=tests.recorder.SampleRecorder", "--trainer.callbacks+=tests.recorder.RankWeights",
                *extra]
        return name, argv, record.parent, clean_env({"SAMPLE_RECORD_DIR": str(record)})

    def samples(name):
        return [json.loads((tmp_path / name / "record" / f"rank{r}.json").read_text())["train"] for r in (0, 1)]

    # The uninterrupted run and the one that is stopped run side by side (one CPU each on the 2-core machine).
    straight_job, stopped_job = jobs = start_all(
        [command("straight"), command("resumed", "--check_every_n_steps", "3",
                                      "--trainer.callbacks+=tests.recorder.SignalAt", "--trainer.callbacks.step=5")],
        tmp_path / "logs")
    assert wait_all(jobs, TIMEOUT_S) is None
    assert straight_job.returncode == 0, straight_job.tail()
    assert stopped_job.returncode == PREEMPTED, stopped_job.tail()
    checkpoint = last_checkpoint(tmp_path / "resumed")
    assert checkpoint["global_step"] == 6 and checkpoint["epoch"] == 1
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


@pytest.mark.oldest
def test_a_sigterm_between_two_optimizer_steps_stops_after_the_next_step_and_resumes_exactly(tmp_path, fashion_root):
    """accumulate_grad_batches 2: 8 batches make 4 optimizer steps. SIGTERM just before batch 3 (the first half of
    step 2): the job stops only after batch 4 (step 2 done), so no accumulated gradient is lost, and the resumed run
    ends the epoch with the uninterrupted run's weights, without a DataPositionWarning."""
    args = [str(TRAIN_PY), "--data_dir", str(fashion_root), *AUGMENTED_CNN, "--epochs", "1",
            "--trainer.accumulate_grad_batches", "2"]
    env = clean_env({"OMP_NUM_THREADS": "1"})
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    straight_dir.mkdir(), resumed_dir.mkdir()
    straight, stopped = jobs = start_all(
        [("straight", args, straight_dir, env),
         ("stopped", [*args, "--check_every_n_steps", "1", "--trainer.callbacks+=tests.recorder.SignalAt",
                      "--trainer.callbacks.batch=3"],
          resumed_dir, env)], tmp_path / "logs")
    assert wait_all(jobs, TIMEOUT_S) is None
    assert straight.returncode == 0, straight.tail()
    assert stopped.returncode == PREEMPTED, stopped.tail()
    assert "stopped by SIGTERM at optimizer step 2 (epoch 1)" in stopped.stderr, stopped.tail()
    checkpoint = last_checkpoint(resumed_dir)
    assert checkpoint["global_step"] == 2
    assert loader_position(checkpoint) == {"epoch": 0, "batches": 4, "batch_size": 32, "world_size": 1}

    resumed = run_train([*args[1:], "--ckpt_path", "last"], cwd=resumed_dir, timeout=TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "DataPositionWarning" not in resumed.stderr, resumed.stderr[-3000:]
    final = last_checkpoint(resumed_dir)
    assert final["global_step"] == 4
    assert_bitwise_equal(last_checkpoint(straight_dir), final)
