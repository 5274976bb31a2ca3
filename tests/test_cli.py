"""train.py as users type it: both command-line forms, config files, help, and one-line errors."""

import os

import pytest
import yaml

from benchmarks.launch import clean_env, start_all, wait_all
from callbacks.run_record import read_rows
from tests.conftest import TRAIN_PY, run_dir, run_train


def test_bad_value_through_the_real_process_exits_2_without_traceback(workdir, fashion_root):
    result = run_train(["--data_dir", str(fashion_root), "--optimizer", "adam"], cwd=workdir)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "train.py: error: unknown optimizer 'adam': choose one of adamw, lamb, lars, novograd, sgd, or give a class " \
        "path (e.g. --optimizer torch.optim.AdamW)" in result.stderr


@pytest.mark.multiprocess
def test_devices_4_on_this_machines_cores_trains_with_one_warning(tmp_path, fashion_root):
    """The design card's own command on the CI machine (2 cores): 4 gloo ranks share them, one thread each."""
    argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", "4", "--network", "mlp",
            "--batch_size", "16", "--epochs", "1", "--test_after_fit", "false", "--data_dir", str(fashion_root)]
    (job,) = start_all([("four", argv, tmp_path, clean_env())], tmp_path / "logs")
    assert wait_all([job], 180) is None
    assert job.returncode == 0, job.tail()
    warnings = [line for line in job.stderr.splitlines() if line.startswith("train.py: warning:")]
    if (os.cpu_count() or 1) < 4:
        assert warnings == [f"train.py: warning: --devices 4 starts more CPU processes than this machine has cores "
                            f"({os.cpu_count()}): the ranks share the cores, one thread each, so images/sec will not "
                            f"scale"], job.stderr
    assert "world size      : 4 (4 device(s) x 1 node(s), cpu, strategy ddp, backend gloo)" in job.stderr
    assert "Epoch 1:" in job.stdout


@pytest.mark.multiprocess  # asks for several ranks (refused before they start)
def test_beyond_8_cpu_processes_per_core_is_refused_before_any_starts(tmp_path, fashion_root):
    """A real process, so that a regression starts training processes under a hard deadline."""
    too_many = 8 * (os.cpu_count() or 1) + 1
    argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", str(too_many),
            "--data_dir", str(fashion_root)]
    (job,) = start_all([("too_many", argv, tmp_path, clean_env())], tmp_path / "logs")
    assert wait_all([job], 60) is None
    assert job.returncode == 2, job.tail()
    errors = [line for line in job.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and f"trainer.devices (--devices) is {too_many}, more than 8 CPU processes per core" \
        in errors[0], job.stderr
    assert "Initializing distributed" not in job.stderr and not (tmp_path / "runs").exists()


def test_unwritable_log_folder_exits_73(shared_tmp, fashion_root):
    """Run as user nobody when the suite runs as root, so that the folder's mode applies; the reason is the failed
    write's own (checks.unwritable_reason tries one, for root and any other user alike)."""
    (shared_tmp / "runs").mkdir(mode=0o555)
    (shared_tmp / "runs").chmod(0o555)
    result = run_train(["--data_dir", str(fashion_root), "--data.download", "false"], cwd=shared_tmp, timeout=60,
                       unprivileged=True)
    assert result.returncode == 73, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert errors == [f"train.py: error: trainer.default_root_dir is runs, which cannot be written: "
                      f"{shared_tmp / 'runs'} is not writable (Permission denied); give a writable folder "
                      f"(--trainer.default_root_dir: logs and checkpoints go under it)"]
    assert list((shared_tmp / "runs").iterdir()) == []




def test_a_runs_saved_config_reruns_it_elsewhere_and_leaves_the_first_run_alone(tmp_path, fashion_root):
    """config.yaml keeps null where train.py derived a folder from default_root_dir, so ``--config
    runs/.../config.yaml --trainer.default_root_dir elsewhere`` trains into ``elsewhere`` (it used to train into the
    first run's folder and replace its last.ckpt), and reproduces the run: the same settings, the same losses."""
    args = ["--network", "mlp", "--data_dir", str(fashion_root), "--epochs", "3", "--batch_size", "32",
            "--trainer.log_every_n_steps", "1", "--test_after_fit", "false", "--trainer.limit_train_batches", "1",
            "--collective_timeout", "40"]
    fake = tmp_path / "bin"  # SLURM installed here, the run outside srun: Lightning's hint is kept out, and said so
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake / "srun").chmod(0o755)
    first = run_train(args, cwd=tmp_path, env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert first.returncode == 0, first.stderr[-2000:]
    for name in ("strategy class", "signals", "hidden output", "breakdown"):  # what no key shows: the start block
        assert f"\n  {name:<16}: " in first.stderr, name
    kept_out = "(its srun hint kept out: srun is on PATH, this run is not under it)"
    assert kept_out in first.stderr and "srun" not in (first.stdout + first.stderr).replace(kept_out, ""), \
        first.stderr[-2000:]
    run = run_dir(tmp_path)
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    config = run / "config.yaml"
    again = run_train(["--config", str(config), "--trainer.default_root_dir", "elsewhere"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before  # not one byte changed
    (moved,) = [p.parent for p in (tmp_path / "elsewhere").glob("*/*/run.json")]
    assert moved.parent.name == run.parent.name and (moved / "checkpoints" / "last.ckpt").is_file()
    settings = [yaml.safe_load(path.read_text()) for path in (config, moved / "config.yaml")]
    assert settings[1]["trainer"].pop("default_root_dir") == "elsewhere" != settings[0]["trainer"].pop("default_root_dir")
    assert settings[0] == settings[1]
    # one batch: 1, not 1.0 (every batch); the worker timeout train.py derives stays null
    limit = settings[0]["trainer"]["limit_train_batches"]
    assert (limit, type(limit), settings[0]["collective_timeout"]) == (1, int, 40)
    assert settings[0]["data"]["worker_timeout"] is None
    losses = [[row["train/loss"] for row in read_rows(folder / "metrics.csv") if row.get("train/loss")]
              for folder in (run, moved)]
    assert len(losses[0]) >= 3 and losses[0] == losses[1]
