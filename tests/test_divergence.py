"""The divergence guard: every rank stops at the same step with exit 70, one line, and no checkpoint of the diverged weights."""

import json
import re
import time

import pytest
import torch

from benchmarks.launch import clean_env, free_port, running_in, start_all, wait_all
from callbacks.run_record import read_epochs
from tests.conftest import TRAIN_PY, experiment_dir, run_dir, run_train

DIVERGED = 70
LINE = re.compile(r"^train\.py: error: training diverged")
TIMEOUT_S = 120


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("train.py: error:")]


def checkpoints(cwd) -> dict:
    """name -> loaded checkpoint, for every .ckpt under ``cwd``."""
    return {p.name: torch.load(p, map_location="cpu", weights_only=False) for p in sorted(cwd.rglob("*.ckpt"))}


def all_finite(checkpoint: dict) -> bool:
    return all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values() if t.is_floating_point())








# ------------------------------------------------------------------ one process, through the real CLI


def test_huge_lr_stops_at_the_first_bad_step_with_one_line_and_no_checkpoint(workdir, fashion_root):
    """Also with checkpointing on exception configured (ModelCheckpoint and OnExceptionCheckpoint): it would
    save exactly the diverged weights, so the guard switches it off for this exception."""
    started = time.monotonic()
    result = run_train(["--data_dir", str(fashion_root), "--lr", "1e6", "--batch_size", "32", "--epochs", "3",
                        "--trainer.callbacks+=lightning.pytorch.callbacks.OnExceptionCheckpoint",
                        f"--trainer.callbacks.dirpath={workdir / 'on_exception'}"],
                       cwd=workdir, timeout=TIMEOUT_S)
    assert result.returncode == DIVERGED, result.stderr[-3000:]
    assert time.monotonic() - started < TIMEOUT_S
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and LINE.match(errors[0]), result.stderr[-3000:]
    assert re.search(r"at optimizer step \d+ \(epoch 1\): .*not finite", errors[0])
    assert "a lower --lr (now 1e+06)" in errors[0] and "--warmup_epochs" in errors[0] and "novograd" in errors[0]
    assert "Traceback" not in result.stderr
    assert checkpoints(workdir) == {}
    assert "Epoch 1:" not in result.stdout  # stopped inside the first epoch


def test_accuracy_at_chance_an_epoch_after_warmup_stops_before_that_epochs_checkpoints(workdir, fashion_root):
    """lr 1e-9 learns nothing: epoch 1 (warm-up) is not judged and saved; epoch 2 is judged and not saved."""
    result = run_train(["--data_dir", str(fashion_root), "--lr", "1e-9", "--batch_size", "32", "--epochs", "3",
                        "--warmup_epochs", "1", "--network", "mlp"], cwd=workdir, timeout=TIMEOUT_S)
    assert result.returncode == DIVERGED, result.stderr[-3000:]
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr[-3000:]
    assert re.match(r"train\.py: error: training diverged: validation accuracy \(val/acc\) is 0\.\d+ after epoch 2 "
                    r"\(optimizer step 16\), at chance \(<= 0\.11\) 1 epoch\(s\) after warm-up ended", errors[0])
    saved = checkpoints(workdir)
    assert "last.ckpt" in saved and {c["epoch"] for c in saved.values()} == {0}  # epoch 1's only
    # The record has epoch 2's validation, the one judged, marked as where the run diverged.
    first, second = read_epochs(run_dir(workdir))
    assert not first.diverged and first.cumulative_s is not None
    assert second.diverged and f"{second.val_acc:.3f}" in errors[0] and second.cumulative_s is None


# ------------------------------------------------------------------ two gloo processes


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_stop_together_with_exit_70_one_line_and_nothing_left(tmp_path, fashion_root, strategy):
    """As users type it: Lightning's launcher starts rank 1 from rank 0. Under fsdp each rank checks its own
    shard of the gradients and weights; the decision is all-reduced."""
    argv = [str(TRAIN_PY), "--strategy", strategy, "--accelerator", "cpu", "--devices", "2", "--network", "mlp",
            "--data_dir", str(fashion_root), "--lr", "1e6", "--batch_size", "32", "--epochs", "3"]
    (job,) = start_all([("launcher", argv, tmp_path, clean_env())], tmp_path / "logs")
    timed_out = wait_all([job], TIMEOUT_S)
    assert timed_out is None, timed_out
    assert job.returncode == DIVERGED, job.tail()
    errors = error_lines(job.stderr)  # rank 1 writes to the same stderr
    assert len(errors) == 1 and LINE.match(errors[0]), job.stderr[-3000:]
    assert "Traceback" not in job.stderr
    assert checkpoints(tmp_path) == {}
    assert running_in(tmp_path) == []  # rank 1 ended too: train.py waited for it


@pytest.mark.multiprocess
def test_a_nan_gradient_on_rank_1_only_stops_both_ranks_at_the_next_decision_and_keeps_epoch_1s_checkpoints(
        tmp_path, fashion_root):
    """Two processes started by hand (as torchrun would), so each rank's exit code and output are seen.

    The nan is put into rank 1's gradients after ddp averaged them: rank 0 cannot see it. 256 images at
    2 × 32 are 4 steps per epoch; step 5 is in epoch 2, after epoch 1's best and last checkpoints. The ranks
    decide every 3 steps: rank 1 notes step 5 on its device, and at step 6 both stop, naming step 5.
    Also counted: healthy batches run no collective of ours but at the decision steps (the counter, appended after
    the Agreement in trainer.callbacks, counts step 3's decision at that batch's end; step 6 stops before it counts),
    and Lightning's per-batch SIGTERM broadcast is off.
    """
    port = free_port()
    record = tmp_path / "record"
    record.mkdir()
    argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--network", "mlp",
            "--data_dir", str(fashion_root), "--batch_size", "32", "--epochs", "3", "--test_after_fit", "false",
            "--check_every_n_steps", "3",
            "--trainer.callbacks+=tests.recorder.NonFiniteGradient", "--trainer.callbacks.step=5",
            "--trainer.callbacks+=tests.recorder.CountCollectives"]
    commands = [(f"rank{rank}", argv, tmp_path,
                 clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                            "NODE_RANK": "0", "LOCAL_RANK": str(rank), "SAMPLE_RECORD_DIR": str(record)}))
                for rank in (0, 1)]
    jobs = start_all(commands, tmp_path / "logs")
    timed_out = wait_all(jobs, TIMEOUT_S)
    assert timed_out is None, timed_out
    assert [job.returncode for job in jobs] == [DIVERGED, DIVERGED], "\n".join(job.tail() for job in jobs)
    rank0, rank1 = (error_lines(job.stderr) for job in jobs)
    assert len(rank0) == 1 and rank1 == [], jobs[0].stderr[-3000:]
    assert re.match(r"train\.py: error: training diverged at optimizer step 5 \(epoch 2\): "
                    r"a gradient is not finite \(net\.\d+\.weight\); stopped on every rank at step 6", rank0[0])
    assert all("Traceback" not in job.stderr for job in jobs)
    saved = checkpoints(tmp_path)
    assert "last.ckpt" in saved and any(name.startswith("best-epoch00") for name in saved), sorted(saved)
    assert {c["epoch"] for c in saved.values()} == {0} and all(all_finite(c) for c in saved.values())
    for rank in (0, 1):  # batches 1-2, 2-3 (step 3's decision), 3-4 of epoch 1
        assert json.loads((record / f"collectives{rank}.json").read_text()) == [0, 1, 0], rank
