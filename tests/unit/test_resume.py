"""Resume without a Trainer: what ``--ckpt_path`` resolves to, when a run is finished, the generators' state, the
TensorBoard run a resume continues, and the loader's position (datamodules/resumable.py)."""

import os
import time
import warnings
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace
from torch.utils.data import SequentialSampler

from datamodules.resumable import (
    DataPositionWarning,
    ResumableDistributedSampler,
    ResumableLoader,
    check_position,
)
from fashion_mnist_dp.cli.outputs import tensorboard_runs
from fashion_mnist_dp.runtime.checkpoint_io import VerifiedCheckpointIO
from fashion_mnist_dp.runtime.errors import CheckpointError
from fashion_mnist_dp.runtime.resume import (
    Resume,
    capture,
    finished_training,
    resolve,
    restore,
)


def loader(epoch: int, rank: int = 0) -> ResumableLoader:
    """50 numbers, 2 ranks (25 each), batch 4: 7 batches per epoch, the last of 1."""
    data = list(range(50))
    sampler = ResumableDistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=7)
    sampler.set_epoch(epoch)
    return ResumableLoader(data, batch_size=4, sampler=sampler)


def batches(iterable) -> list:
    return [batch.tolist() for batch in iterable]


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    state = capture()
    torch.save({"callbacks": {"RngState": state}}, tmp_path / "x.ckpt")
    loaded = torch.load(tmp_path / "x.ckpt", weights_only=True)["callbacks"]["RngState"]  # as LightningCLI reads it
    expected = torch.rand(5)
    restore(loaded)
    assert torch.equal(torch.rand(5), expected)


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




def save(path: Path, step: int = 8, mtime: float = 0.0) -> Path:
    VerifiedCheckpointIO().save_checkpoint({"global_step": step}, path)
    if mtime:
        os.utime(path, (mtime, mtime))
    return path


def test_last_resolves_to_the_newest_valid_last_checkpoint_and_continues_its_run(tmp_path):
    old, new = save(tmp_path / "last-v1.ckpt", mtime=time.time() - 60), save(tmp_path / "last.ckpt")
    assert resolve("last", [tmp_path]) == Resume(str(new), why="resumed")
    new.write_bytes(new.read_bytes()[:-10])  # truncated: skipped with a warning
    resumed = resolve("last", [tmp_path])
    assert resumed.path == str(old)
    assert resumed.lines[0].startswith("warning: checkpoint") and "last.ckpt is damaged" in resumed.lines[0]
    assert resumed.lines[1].startswith("warning: --ckpt_path last resumes from")


def test_last_falls_back_to_any_valid_checkpoint_and_fails_when_none_is(tmp_path):
    best = save(tmp_path / "best-epoch00.ckpt")
    last = tmp_path / "last.ckpt"
    last.write_bytes(b"not a checkpoint")
    assert resolve("last", [tmp_path]).path == str(best)
    best.unlink()
    with pytest.raises(CheckpointError, match="--ckpt_path last found no valid checkpoint"):
        resolve("last", [tmp_path])


def test_last_with_nothing_saved_is_refused_except_under_torchrun_restarts(tmp_path):
    with pytest.raises(CheckpointError, match=r"no last checkpoint \(last\*.ckpt\) in .*nothing to resume"):
        resolve("last", [tmp_path])
    first = resolve("last", [tmp_path], restarts=3, attempt=1)
    assert first.path is None and first.lines[0].endswith("starting a new run (torchrun attempt 1 of 4)")


def test_last_with_nothing_saved_names_the_other_experiments_that_have_a_last_checkpoint(tmp_path):
    mine, other, empty = (tmp_path / name for name in ("cnn-ddp", "mlp-ddp", "wrn-ddp"))
    for experiment in (mine, other, empty):
        (experiment / "run1" / "checkpoints").mkdir(parents=True)
        (experiment / "run1" / "run.json").write_text("{}")
    save(other / "run1" / "checkpoints" / "last.ckpt")
    with pytest.raises(CheckpointError, match=rf"nothing to resume.*; runs of other experiments have one \({other}/run1\)"
                                              rf": the experiment's folder is named by its network"):
        resolve("last", [], root=str(tmp_path), experiment=mine)


def test_hpc_is_the_largest_n_in_the_root_and_refused_when_there_is_none(tmp_path):
    with pytest.raises(CheckpointError, match=r"--ckpt_path hpc: no hpc_ckpt_N.ckpt in .*give a .ckpt file instead"):
        resolve("hpc", [], root=str(tmp_path))
    for n in (9, 10):
        save(tmp_path / f"hpc_ckpt_{n}.ckpt")
    assert resolve("hpc", [], root=str(tmp_path)).path == str(tmp_path / "hpc_ckpt_10.ckpt")


def test_best_files_and_lightnings_own_keywords(tmp_path):
    save(tmp_path / "best-epoch03.ckpt")
    with pytest.raises(CheckpointError, match="give the file instead.*best-epoch03.ckpt"):
        resolve("best", [tmp_path])
    with pytest.raises(CheckpointError, match="checkpoint not found: nope.ckpt"):
        resolve("nope.ckpt", [tmp_path])
    assert resolve(str(tmp_path / "best-epoch03.ckpt"), []).path == str(tmp_path / "best-epoch03.ckpt")
    assert resolve("s3://bucket/x.ckpt", []).path == "s3://bucket/x.ckpt"
    assert resolve(None, []) == Resume()


def test_a_run_is_finished_by_epochs_or_steps():
    checkpoint = {"global_step": 24, "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": 3}}}}}
    assert finished_training(checkpoint, max_epochs=3, max_steps=-1) == \
        "has finished training: 3 epoch(s) trained, --epochs 3"
    assert finished_training(checkpoint, max_epochs=4, max_steps=-1) is None
    assert "24 optimizer steps trained" in finished_training(checkpoint, max_epochs=10, max_steps=20)


def test_a_continued_run_purges_tensorboard_from_its_step_and_a_new_one_from_zero():
    """In the config, before any logger is built: a new run opens with a purge at step 0, a continued run (``last``)
    at its checkpoint's step; a logger class that takes no ``purge_step`` is left as Lightning has it. The filled keys
    stay null in the saved config.yaml."""
    def config(class_path="callbacks.run_record.MetricsCSV"):
        logger = Namespace(class_path=class_path, init_args=Namespace(save_dir="runs", name="fm", purge_step=None))
        return Namespace(trainer=Namespace(logger=[logger]))

    resumed, new = config(), config()
    assert tensorboard_runs(resumed, True, 16) == [("trainer.logger", 0, "purge_step")]
    assert resumed.trainer.logger[0].init_args.purge_step == 16
    assert tensorboard_runs(new, False, 16) == [("trainer.logger", 0, "purge_step")]
    assert new.trainer.logger[0].init_args.purge_step == 0
    assert tensorboard_runs(config("lightning.pytorch.loggers.TensorBoardLogger"), True, 16) == []


@pytest.mark.parametrize("world, rank", [(1, 0), (2, 1)])
def test_a_process_with_virtual_devices_takes_its_ranks_batches_in_rank_order(world, rank):
    """3 virtual devices at batch 4: each step is rank 0's batch, then rank 1's, then rank 2's, as their own
    samplers (DistributedSampler's order and padding) give them, also resumed part-way."""
    data, n = list(range(50)), 3
    virtual = ResumableDistributedSampler(data, num_replicas=world * n, rank=rank * n, seed=7, virtual=n, batch=4)
    shards = [list(ResumableDistributedSampler(data, num_replicas=world * n, rank=rank * n + v, seed=7))
              for v in range(n)]
    expected = [i for start in range(0, len(shards[0]), 4) for shard in shards for i in shard[start:start + 4]]
    assert list(virtual) == expected and len(virtual) == len(expected) == n * len(shards[0])
    virtual.resume_at(0, 12)
    assert list(virtual) == expected[12:]


@pytest.mark.parametrize("which", ["last", "file"])
def test_a_resumed_fit_reads_and_hashes_its_checkpoint_once_in_all(workdir, fashion_root, monkeypatch, which):
    """The CLI verifies --ckpt_path's file and reads it once: its hyperparameters (one parse layer, not LightningCLI's
    second read), the finished-run check and Lightning's own restore (handed the same copy) take that one read."""
    from fashion_mnist_dp.cli import app
    from fashion_mnist_dp.runtime import checkpoint_io

    tiny = ["--network", "mlp", "--data_dir", str(fashion_root), "--trainer.limit_train_batches", "2",
            "--trainer.limit_val_batches", "1", "--test_after_fit", "false"]
    assert app.main([*tiny, "--epochs", "1"]) == 0
    last = next(workdir.glob("runs/*/*/checkpoints/last.ckpt"))
    resumed = (str(last), last.stat().st_mtime_ns)  # the epoch-2 save rewrites last.ckpt: another file then
    loads, hashes = [], []
    torch_load, file_sha256 = torch.load, checkpoint_io.file_sha256
    stamp = (lambda f: (str(f), Path(f).stat().st_mtime_ns) if isinstance(f, (str, Path)) else None)
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loads.append(stamp(f)) or torch_load(f, *a, **k))
    monkeypatch.setattr(checkpoint_io, "file_sha256", lambda f: hashes.append(stamp(f)) or file_sha256(f))
    assert app.main([*tiny, "--epochs", "2", "--ckpt_path", "last" if which == "last" else str(last)]) == 0
    assert loads.count(resumed) == 1 and hashes.count(resumed) == 1, (loads, hashes)
