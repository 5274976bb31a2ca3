"""What the user gives wins over a checkpoint's stored hyperparameters, for a file and for ``--ckpt_path last`` alike;
the checkpoint fills in what was not given, and the start block names every difference. And where a run's files go:
``--trainer.default_root_dir``."""

import pytest

from tests.conftest import experiment_dir, run_dir, run_train

TINY = ["--batch_size", "32", "--test_after_fit", "false", "--trainer.log_every_n_steps", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, fashion_root):
    """One epoch of the mlp at lr 0.05 with a 1-epoch warm-up (8 steps per epoch); every step's lr logged."""
    cwd = tmp_path_factory.mktemp("trained")
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--lr", "0.05", "--warmup_epochs", "1",
                        "--epochs", "1", *TINY], cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd


def trained_lrs(root) -> list:
    """The lr each step trained at, as LearningRateMonitor logged it (metrics.csv of the newest run under root)."""
    from callbacks.run_record import read_rows, run_dirs

    return [float(row["lr-SGD/pg1"]) for row in read_rows(run_dirs(root)[-1] / "metrics.csv") if row.get("lr-SGD/pg1")]


def test_a_given_lr_wins_over_the_checkpoint_file_and_the_network_comes_from_it(trained, fashion_root, tmp_path):
    last = run_dir(trained) / "checkpoints" / "last.ckpt"
    result = run_train(["--data_dir", str(fashion_root), "--ckpt_path", str(last), "--lr", "0.5", "--epochs", "2",
                        *TINY, "--trainer.default_root_dir", str(tmp_path / "new")], cwd=trained)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "learning rate   : base 0.5 at batch 32 -> 0.5" in result.stdout + result.stderr, result.stdout
    assert "given over the checkpoint: --lr 0.5 (checkpoint: 0.05) (last.ckpt stored the values in brackets)" \
        in result.stdout + result.stderr
    assert "network         : MLP" in result.stdout + result.stderr  # not given: the checkpoint's, so its weights load
    assert "warm-up         : 8 optimizer steps" in result.stdout + result.stderr  # not given: the checkpoint's warm-up epoch
    assert trained_lrs(tmp_path / "new") == pytest.approx([0.5] * 8)  # the warm-up ended with epoch 1: 0.5 throughout


def test_the_same_rule_for_last(trained, fashion_root):
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--ckpt_path", "last", "--lr", "0.2",
                        "--epochs", "2", *TINY], cwd=trained)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "learning rate   : base 0.2 at batch 32 -> 0.2" in result.stdout + result.stderr, result.stdout
    assert "given over the checkpoint: --lr 0.2 (checkpoint: 0.05)" in result.stdout + result.stderr
    assert "warm-up         : 8 optimizer steps" in result.stdout + result.stderr
    # the same run folder, continued: the first epoch at 0.05 (warm-up from the base lr to itself), then 0.2
    assert trained_lrs(trained / "runs") == pytest.approx([0.05] * 8 + [0.2] * 8)


def test_values_equal_to_the_stored_ones_say_nothing(trained, fashion_root, tmp_path):
    last = run_dir(trained) / "checkpoints" / "last.ckpt"
    result = run_train(["test", "--data_dir", str(fashion_root), "--ckpt_path", str(last), "--network", "mlp",
                        "--trainer.default_root_dir", str(tmp_path)], cwd=trained)
    assert result.returncode == 0 and "given over the checkpoint" not in result.stdout + result.stderr, result.stderr[-3000:]


def test_default_root_dir_holds_the_logs_and_checkpoints_and_last_looks_there(workdir, fashion_root):
    root = workdir / "scratch" / "exp1"
    args = ["--data_dir", str(fashion_root), "--network", "mlp", *TINY, "--trainer.default_root_dir", str(root)]
    assert run_train([*args, "--epochs", "1"], cwd=workdir).returncode == 0
    assert not (workdir / "runs").exists()
    (run,) = (root / "mlp-auto-batch32-sgd").iterdir()
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "metrics.csv").is_file()
    result = run_train([*args, "--epochs", "2", "--ckpt_path", "last"], cwd=workdir)
    assert result.returncode == 0 and "Restoring states from the checkpoint path at " + str(run) in result.stderr, \
        result.stderr[-3000:]


def test_an_unwritable_default_root_dir_exits_73_before_training(workdir, fashion_root):
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--trainer.default_root_dir",
                        "/proc/forbidden"], cwd=workdir)
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert result.returncode == 73 and len(errors) == 1, result.stderr[-2000:]
    assert "trainer.default_root_dir is /proc/forbidden, which cannot be written" in errors[0]
    assert "Epoch" not in result.stdout + result.stderr and "Traceback" not in result.stderr and not (workdir / "runs").exists()
