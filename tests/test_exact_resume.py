"""Exact resume: a run stopped at an epoch boundary, or by SIGTERM in the middle of an epoch, and resumed with
--ckpt_path last ends with the same weights, bit for bit, as the uninterrupted run (CPU, same seed, same world size).

The cnn (dropout draws from torch's generator every step). One process: with random crop and flip (drawn per
(seed, rank, epoch, batch)). Two ddp processes over gloo: without augmentation, so the images still carry their
index and the test also sees which samples each rank trained on before and after the stop. The loader's position
(datamodules/resumable.py) is also tested alone, without training.
"""

import json
import warnings

import pytest
import torch
from torch.utils.data import SequentialSampler

from callbacks.rng_state import capture, restore
from datamodules.resumable import DataPositionWarning, ResumableDistributedSampler, ResumableLoader, check_position
from tests.conftest import TRAIN_PY, run_train
from tests.processes import clean_env, running_in, start_all, wait_all

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
    return torch.load(cwd / "runs" / "fashion_mnist" / "checkpoints" / "last.ckpt", weights_only=False)


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
        ("stopped", resumed, ["--epochs", "2", "--trainer.callbacks+=tests.recorder.SignalAt",
                              "--trainer.callbacks.step=3"]),
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


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    state = capture()
    torch.save({"callbacks": {"RngState": state}}, tmp_path / "x.ckpt")
    loaded = torch.load(tmp_path / "x.ckpt", weights_only=True)["callbacks"]["RngState"]  # as LightningCLI reads it
    expected = torch.rand(5)
    restore(loaded)
    assert torch.equal(torch.rand(5), expected)


def loader(epoch: int, rank: int = 0) -> ResumableLoader:
    """50 numbers, 2 ranks (25 each), batch 4: 7 batches per epoch, the last of 1."""
    data = list(range(50))
    sampler = ResumableDistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=7)
    sampler.set_epoch(epoch)
    return ResumableLoader(data, batch_size=4, sampler=sampler)


def batches(iterable) -> list:
    return [batch.tolist() for batch in iterable]


def test_a_loader_given_its_saved_position_hands_out_exactly_the_rest_of_that_epoch():
    for rank in (0, 1):
        whole = batches(loader(epoch=1, rank=rank))
        first = loader(epoch=1, rank=rank)
        iterator = iter(first)
        head = [next(iterator).tolist() for _ in range(3)]
        state = first.state_dict()
        assert state == {"epoch": 1, "batches": 3, "batch_size": 4, "world_size": 2}

        again = loader(epoch=0, rank=rank)  # a new process: its sampler's epoch comes from the state
        again.load_state_dict(state)
        rest = batches(again)
        assert head + rest == whole and len(rest) == 4 and len(again) == 7
        assert again.state_dict()["batches"] == 7
        again.sampler.set_epoch(2)
        assert len(batches(again)) == 7  # the next epoch is whole


def test_a_saved_position_of_another_epoch_is_dropped():
    """A checkpoint written at the end of epoch 1 (position: epoch 0, all 7 batches) resumes with epoch 2, whole."""
    resumed = loader(epoch=0)
    resumed.load_state_dict({"epoch": 0, "batches": 7, "batch_size": 4, "world_size": 2})
    resumed.sampler.set_epoch(1)  # Lightning's set_epoch before the epoch's first batch
    assert batches(resumed) == batches(loader(epoch=1))


def test_the_loader_lightning_makes_for_overfit_batches_is_a_plain_one():
    """--trainer.overfit_batches: Lightning re-creates the training loader with a SequentialSampler (no position)."""
    plain = ResumableLoader(list(range(10)), batch_size=4, sampler=SequentialSampler(range(10)))
    plain.load_state_dict({"epoch": 0, "batches": 1, "batch_size": 4, "world_size": 1})
    assert batches(plain) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and plain.state_dict() == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_position(plain, epoch=0, batches_before=5)


def test_a_shifted_resume_is_never_silent():
    """No position in the checkpoint (Lightning is at batch 4, the loader at 1), another batch size, or a resume
    between two optimizer steps: one DataPositionWarning each; an exact resume: none."""
    plain = loader(epoch=1)
    next(iter(plain))
    with pytest.warns(DataPositionWarning, match="out of step with the resumed loop: Lightning is at batch 4"):
        check_position(plain, epoch=1, batches_before=3)

    with pytest.warns(DataPositionWarning, match="batch size 8 per process"):
        loader(epoch=1).load_state_dict({"epoch": 1, "batches": 3, "batch_size": 8, "world_size": 2})

    state = {"epoch": 1, "batches": 3, "batch_size": 4, "world_size": 2}
    between = loader(epoch=1)
    between.load_state_dict(state)
    next(iter(between))
    with pytest.warns(DataPositionWarning, match="the gradients of batch 3 were not in the checkpoint"):
        check_position(between, epoch=1, batches_before=3, accumulate=2)

    exact = loader(epoch=1)
    exact.load_state_dict(state)
    iterator = iter(exact)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batches_before in (3, 4):
            next(iterator)
            check_position(exact, epoch=1, batches_before=batches_before, accumulate=1)


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
    """2 gloo ranks × batch 32: 4 steps per epoch, 3 epochs. SIGTERM to rank 0 after step 6 (batch 2 of epoch 2).
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
        [command("straight"), command("resumed", "--trainer.callbacks+=tests.recorder.SignalAt",
                                      "--trainer.callbacks.step=6")], tmp_path / "logs")
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
         ("stopped", [*args, "--trainer.callbacks+=tests.recorder.SignalAt", "--trainer.callbacks.batch=3"],
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
