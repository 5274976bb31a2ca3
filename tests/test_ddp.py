"""Two CPU processes over gloo, started exactly as a user would: disjoint shards, every test image once, rank 0 reports."""

import json

import pytest

from benchmarks.launch import clean_env, start_all, wait_all
from tests.conftest import TRAIN_PY, run_train, experiment_dir, run_dir
from tests.test_training import epoch_lines

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, fashion_root):
    cwd = tmp_path_factory.mktemp("ddp")
    record = cwd / "record"
    record.mkdir()
    args = ["--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--data_dir", str(fashion_root),
            "--epochs", "2", "--batch_size", "32", "--trainer.callbacks+=tests.recorder.SampleRecorder"]
    result = run_train(args, cwd=cwd, env={"SAMPLE_RECORD_DIR": str(record)})
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((record / f"rank{r}.json").read_text()) for r in (0, 1)]
    return cwd, result, ranks


@pytest.mark.oldest
def test_each_epoch_ranks_train_on_disjoint_shards_that_cover_the_split(ddp_run):
    _, _, ranks = ddp_run
    assert [r["world_size"] for r in ranks] == [2, 2]
    for epoch in ("0", "1"):
        shard0, shard1 = (r["train"][epoch] for r in ranks)
        assert len(shard0) == len(shard1) == 128
        assert not set(shard0) & set(shard1)
        assert sorted(shard0 + shard1) == list(range(256))
    assert ranks[0]["train"]["0"] != ranks[0]["train"]["1"]  # reshuffled every epoch


@pytest.mark.oldest
def test_validation_counts_every_test_image_exactly_once(ddp_run):
    _, _, ranks = ddp_run
    assert len(ranks[0]["val"]) == len(ranks[1]["val"]) == 4  # twice an epoch (configs/default.yaml)
    for seen0, seen1 in zip(ranks[0]["val"], ranks[1]["val"]):
        assert sorted(seen0 + seen1) == list(range(101))  # 101 images: no padded duplicate


@pytest.mark.oldest
def test_only_rank0_reports_and_the_start_block_shows_the_world(ddp_run):
    cwd, result, _ = ddp_run
    lines = epoch_lines(result.stdout)
    assert [m.epoch for m in lines] == [1, 2]
    log = result.stdout + result.stderr
    assert log.count("Run configuration") == 1
    assert "world size      : 2 (2 device(s) x 1 node(s), cpu, strategy ddp, backend gloo)" in log
    assert "32 per device x 2 x 1 x accumulate 1 = effective 64" in log
    assert "base 0.05 at batch 32 -> 0.1 (linear scaling)" in log
    assert len([p for p in experiment_dir(cwd).iterdir()]) == 1  # one run folder
    assert (run_dir(cwd) / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.oldest
def test_a_ddp_run_prints_no_deprecation_warning_from_our_calls(ddp_run):
    """torch 2.14 deprecates all_gather_into_tensor: fashion_mnist_dp/runtime/agreement.py's gather printed a FutureWarning twice
    per rank before it used all_gather_single."""
    _, result, _ = ddp_run
    assert "FutureWarning" not in result.stderr and "DeprecationWarning" not in result.stderr, result.stderr[-3000:]


def test_two_process_predictions_equal_one_process(ddp_run, fashion_root, tmp_path):
    cwd, _, _ = ddp_run
    last = run_dir(cwd) / "checkpoints" / "last.ckpt"
    outputs = []
    for devices in ("2", "1"):
        out_dir = tmp_path / f"devices{devices}"
        result = run_train(["predict", "--strategy", "ddp" if devices == "2" else "auto", "--accelerator", "cpu",
                            "--devices", devices, "--data_dir", str(fashion_root), "--ckpt_path", str(last),
                            "--trainer.callbacks+=callbacks.PredictionCSV",
                            f"--trainer.callbacks.init_args.output_dir={out_dir}"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append((out_dir / "predictions.csv").read_text())
    assert outputs[0] == outputs[1]
    assert len(outputs[0].splitlines()) == 102


def test_two_jobs_started_together_without_master_port_pick_different_ports(tmp_path, fashion_root):
    """No MASTER_PORT: Lightning's launcher takes a free port (bind(0)) per job, so two jobs do not collide.

    With one fixed port the second job's store fails with "address already in use" and its
    rank 1 may join the first job instead.
    """
    commands = []
    for name in ("job_a", "job_b"):
        cwd, record = tmp_path / name, tmp_path / f"{name}_record"
        cwd.mkdir()
        record.mkdir()
        argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--data_dir",
                str(fashion_root), "--epochs", "1", "--batch_size", "32", "--test_after_fit", "false",
                "--trainer.callbacks+=tests.recorder.SampleRecorder"]
        commands.append((name, argv, cwd, clean_env({"SAMPLE_RECORD_DIR": str(record)})))  # drops MASTER_PORT
    jobs = start_all(commands, tmp_path / "logs")
    timed_out = wait_all(jobs, 300)
    assert timed_out is None, timed_out
    assert [job.returncode for job in jobs] == [0, 0], "\n".join(job.tail() for job in jobs)
    ports = []
    for job in jobs:
        ranks = [json.loads((tmp_path / f"{job.name}_record" / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert sorted(ranks[0]["train"]["0"] + ranks[1]["train"]["0"]) == list(range(256))  # its own two ranks
        assert ranks[0]["main_port"] == ranks[1]["main_port"]
        ports.append(ranks[0]["main_port"])
        assert [m.epoch for m in epoch_lines(job.stdout)] == [1]
        assert (run_dir(job.cwd) / "checkpoints" / "last.ckpt").is_file()
    assert ports[0] != ports[1]
