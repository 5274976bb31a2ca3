"""--target_accuracy/--patience stop at the right epoch; the run's record (metrics.csv) holds what the epoch lines
print."""

import re

import pytest

from callbacks.run_record import read_epochs
from tests.conftest import experiment_dir, run_dir, run_train
from tests.test_training import epoch_lines

STOP_LINE = re.compile(
    r"^Target reached: val/acc >= (\S+) for (\d+) consecutive epoch\(s\); stopping after epoch (\d+) "
    r"\(Val Acc = (\d\.\d{3}), Cumulative Time = (\d+\.\d{3})\)$", re.M
)
# The mlp at a small lr, two steps per epoch: accuracy climbs over several epochs on the tiny data.
SLOW = ["--network", "mlp", "--lr", "0.002", "--batch_size", "32", "--trainer.limit_train_batches", "2",
        "--epochs", "8", "--test_after_fit", "false", "--accelerator", "cpu"]
TARGET, PATIENCE = 0.5, 2






def expected_stop(accuracies, target, patience):
    """The first epoch (1-based) closing `patience` consecutive epochs at or above target, from the printed values."""
    run = 0
    for epoch, acc in enumerate(accuracies, 1):
        run = run + 1 if acc >= target else 0
        if run >= patience:
            return epoch
    return None


def check_stop_and_record(result, run_dir):
    assert result.returncode == 0, result.stderr[-3000:]
    lines = epoch_lines(result.stdout)
    accuracies = [m.val_acc for m in lines]
    stop = expected_stop(accuracies, TARGET, PATIENCE)
    assert stop is not None and len(lines) == stop < 8, result.stdout  # stopped early, at that very epoch
    assert accuracies[0] < TARGET  # not trivially: the first epoch was below the target
    (stop_line,) = STOP_LINE.findall(result.stdout)
    assert stop_line == (f"{TARGET:g}", str(PATIENCE), str(stop), f"{lines[-1].val_acc:.3f}", f"{lines[-1].cumulative_s:.3f}")
    records = read_epochs(run_dir)
    assert [r.epoch for r in records] == list(range(1, stop + 1))  # one record per epoch
    for record, line in zip(records, lines):  # each line printed from its record
        assert (f"{record.cumulative_s:.3f}", f"{record.images_per_sec:.2f}") == (
            f"{line.cumulative_s:.3f}", f"{line.images_per_sec:.2f}")
        assert (f"{record.val_loss:.3f}", f"{record.val_acc:.3f}") == (f"{line.val_loss:.3f}", f"{line.val_acc:.3f}")
    assert (run_dir / "time_to_accuracy.png").stat().st_size > 1000


def test_stops_after_patience_epochs_at_target_and_records_time_to_accuracy(workdir, fashion_root):
    result = run_train(["--data_dir", str(fashion_root), *SLOW, "--target_accuracy", str(TARGET),
                        "--patience", str(PATIENCE)], cwd=workdir)
    check_stop_and_record(result, run_dir(workdir))


def test_without_a_target_every_epoch_runs_and_is_recorded(workdir, fashion_root):
    result = run_train(["--data_dir", str(fashion_root), *SLOW, "--epochs", "2"], cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Target reached" not in result.stdout
    assert len(read_epochs(run_dir(workdir))) == len(epoch_lines(result.stdout)) == 2


@pytest.mark.multiprocess
def test_two_ddp_ranks_stop_together_and_rank_0_alone_reports(workdir, fashion_root):
    result = run_train(["--data_dir", str(fashion_root), *SLOW, "--strategy", "ddp", "--devices", "2",
                        "--batch_size", "16", "--target_accuracy", str(TARGET), "--patience", str(PATIENCE)],
                       cwd=workdir)
    check_stop_and_record(result, run_dir(workdir))
