"""A run's own folder: its name, and which run ``--ckpt_path last`` resumes: the named one, this job's own (a requeue,
a restart: never another job's), else the experiment's newest, else a checkpoint from before runs had folders of
their own. Made and held by processes: tests/test_run_folders.py."""

import json
import os
import time
from pathlib import Path

import pytest

from fashion_mnist_dp.runtime import runs
from fashion_mnist_dp.runtime.errors import CheckpointError, ConfigError
from fashion_mnist_dp.runtime.checkpoint_io import VerifiedCheckpointIO
from fashion_mnist_dp.runtime.resume import resolve


def run(experiment: Path, name: str, jobs=(), step=None, mtime=None) -> Path:
    """A run folder as train.py leaves it: run.json with the jobs that started it, and a last checkpoint at ``step``."""
    folder = experiment / name
    (folder / "checkpoints").mkdir(parents=True)
    (folder / runs.RECORD).write_text(json.dumps({"run": name, "starts": [{"jobs": list(jobs)}]}))
    if step is not None:
        last = folder / "checkpoints" / "last.ckpt"
        VerifiedCheckpointIO().save_checkpoint({"global_step": step}, last)
        if mtime is not None:
            os.utime(last, (mtime, mtime))
    return folder


def test_a_run_is_named_by_when_it_started_and_its_seed():
    now = 1796169600.0  # 2026-12-02 00:00:00 UTC
    assert runs.new_name(42, "fit", now) == "20261202-000000-seed42"
    assert runs.new_name(None, "fit", now) == "20261202-000000"
    assert runs.new_name(True, "fit", now) == "20261202-000000"  # a bool is no seed
    assert runs.new_name(7, "test", now) == "20261202-000000-seed7-test"


@pytest.mark.parametrize("name, problem", [("", "is empty"), ("a/b", "holds a path separator"),
                                            ("..", "starts with a dot"), (".hidden", "starts with a dot"),
                                            ("x" * 101, "is 101 characters long")])
def test_a_run_name_must_be_a_folder_name(name, problem):
    assert problem in runs.name_problem(name)
    assert runs.name_problem("lr0.1 seed 3") is None


def test_last_resumes_the_newest_run_of_the_experiment_and_says_why(tmp_path):
    experiment = tmp_path / "exp"
    run(experiment, "old", step=4, mtime=time.time() - 60)
    run(experiment, "new", step=8)
    run(experiment, "empty")
    resumed = resolve("last", [], experiment=experiment, environ={})
    assert resumed.path == str(experiment / "new" / "checkpoints" / "last.ckpt") and resumed.run == "new"
    assert resumed.continued and resumed.newest
    assert resumed.why == "the newest of 2 run(s) of this experiment with a checkpoint"


def test_run_name_picks_the_run_and_a_name_without_a_checkpoint_is_66_unless_restarting(tmp_path):
    experiment = tmp_path / "exp"
    run(experiment, "a", step=4, mtime=time.time() - 60)
    run(experiment, "b", step=8)
    resumed = resolve("last", [], experiment=experiment, run_name="a", environ={})
    assert (resumed.run, resumed.path, resumed.why) == ("a", str(experiment / "a/checkpoints/last.ckpt"),
                                                       "the run --run_name names")
    with pytest.raises(CheckpointError, match=r"--ckpt_path last --run_name c: .*exp/c holds no checkpoint \(runs of "
                                              r"this experiment: a, b\)"):
        resolve("last", [], experiment=experiment, run_name="c", environ={})
    again = resolve("last", [], restarts=2, experiment=experiment, run_name="c", environ={})
    assert (again.path, again.run, again.continued) == (None, "c", True)


SLURM_TASK_1 = {"SLURM_JOB_ID": "101", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "1"}


def test_a_requeued_array_task_resumes_its_own_run_never_a_newer_one_of_another_task(tmp_path):
    experiment = tmp_path / "exp"
    run(experiment, "task1", jobs=["SLURM job 100_1"], step=4, mtime=time.time() - 60)
    run(experiment, "task2", jobs=["SLURM job 100_2"], step=8)
    requeued = {**SLURM_TASK_1, "SLURM_RESTART_COUNT": "1"}
    resumed = resolve("last", [], experiment=experiment, environ=requeued)
    assert (resumed.run, resumed.why, resumed.newest) == ("task1", "the run of this SLURM job 100_1", False)
    assert runs.job_keys(requeued) == ("SLURM job 100_1",)


def test_a_requeued_job_whose_first_start_saved_nothing_starts_again_in_a_new_run(tmp_path):
    experiment = tmp_path / "exp"
    run(experiment, "other", jobs=["SLURM job 200"], step=8)
    resumed = resolve("last", [], experiment=experiment, environ={"SLURM_JOB_ID": "201", "SLURM_RESTART_COUNT": "1"})
    assert resumed.path is None and resumed.run is None
    assert resumed.lines == (f"--ckpt_path last: no run of this SLURM job 201 in {experiment} (its first start saved "
                             f"nothing): starting a new run",)
    run(experiment, "mine", jobs=["SLURM job 201"])  # started, no checkpoint yet: started again in its own folder
    again = resolve("last", [], experiment=experiment, environ={"SLURM_JOB_ID": "201", "SLURM_RESTART_COUNT": "1"})
    assert (again.path, again.run, again.continued) == (None, "mine", True)


def test_a_torchrun_restart_resumes_the_run_of_its_run_id(tmp_path):
    experiment = tmp_path / "exp"
    run(experiment, "mine", jobs=["torchrun run abc"], step=4, mtime=time.time() - 60)
    run(experiment, "newer", jobs=["torchrun run xyz"], step=8)
    restart = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3"}
    assert resolve("last", [], restarts=3, attempt=2, experiment=experiment, environ=restart).run == "mine"
    assert runs.job_keys({"TORCHELASTIC_RUN_ID": "none"}) == ()  # a static rendezvous without --rdzv-id: no job


def test_a_checkpoint_from_before_runs_had_folders_is_resumed_into_a_new_run(tmp_path):
    legacy = tmp_path / "cnn-single-1x128-sgd" / "checkpoints"
    legacy.mkdir(parents=True)
    VerifiedCheckpointIO().save_checkpoint({"global_step": 3}, legacy / "last.ckpt")
    resumed = resolve("last", [], experiment=tmp_path / "cnn-auto-batch128-sgd", legacy=legacy, environ={})
    assert resumed.path == str(legacy / "last.ckpt") and resumed.run is None and not resumed.continued
    assert "written before each run had a folder of its own" in resumed.lines[-1]
    assert sorted(p.name for p in legacy.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]  # nothing moved


def test_a_new_run_named_like_an_existing_one_is_refused(tmp_path):
    run(tmp_path / "exp", "taken", step=8)
    with pytest.raises(ConfigError, match=r"--run_name taken: run .*taken exists already; resume it with --ckpt_path "
                                          r"last --run_name taken, or give another --run_name"):
        runs.claim(tmp_path / "exp", "taken", False, False, "unused", {})


class _Loader:
    virtual_devices, batch_size = 1, 32


class _Trainer:
    def __init__(self, world_size: int) -> None:
        self.world_size, self.accumulate_grad_batches, self.strategy = world_size, 1, object()


def checkpoint_at(epoch: int, batches: int, world_size: int, epochs_done: int) -> dict:
    return {"FashionMNISTDataModule": {"train_position": {"epoch": epoch, "batches": batches, "batch_size": 32,
                                                          "world_size": world_size}},
            "lr_schedulers": [{"base_lrs": [0.1, 0.1]}],
            "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": epochs_done}}}}}


def test_the_start_block_says_how_the_world_changed_and_where_the_data_goes_on():
    """A checkpoint of 2 processes resumed on 1: the effective batch and lr then, and at an epoch's end the next epoch
    starts at its first batch; mid-epoch, the rest of it goes on at the next batch of the new order."""
    from fashion_mnist_dp.cli.run_folders import world_changed

    FashionMNISTDataModule = type("FashionMNISTDataModule", (_Loader,), {})  # the key Lightning saves its state at
    data = FashionMNISTDataModule()
    assert world_changed(_Trainer(1), data, checkpoint_at(1, 4, 2, epochs_done=2)) == [
        "  resumed from    : 2 process(es) of 32 images a batch, effective 64 at lr 0.1 (now: as above); epoch 3 "
        "starts at its first batch"]
    assert world_changed(_Trainer(1), data, checkpoint_at(1, 3, 2, epochs_done=1)) == [
        "  resumed from    : 2 process(es) of 32 images a batch, effective 64 at lr 0.1 (now: as above); epoch 2 goes "
        "on at batch 4 of the new order, so some of its images are trained twice or not at all"]
    assert world_changed(_Trainer(2), data, checkpoint_at(1, 3, 2, epochs_done=1)) == []  # the same world
    assert world_changed(_Trainer(1), data, {}) == []
