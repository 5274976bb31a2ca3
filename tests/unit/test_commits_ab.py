"""benchmarks/commits_ab.py reads a run's speed from its TensorBoard file: epochs 2..n, their median."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmarks.commits_ab import TAG, steady_speed


def write_epochs(folder, values):
    writer = SummaryWriter(str(folder / "some-run" / "version_0"))
    for epoch, value in enumerate(values):
        writer.add_scalar(TAG, value, epoch)
    writer.close()


def test_the_speed_of_a_run_is_the_median_of_its_epochs_after_the_first(tmp_path):
    write_epochs(tmp_path, [100.0, 200.0, 300.0, 250.0])  # epoch 1 (start-up) left out
    assert steady_speed(tmp_path) == 250.0


def test_a_run_of_one_epoch_has_no_steady_state_and_says_so(tmp_path):
    write_epochs(tmp_path, [100.0])
    with pytest.raises(RuntimeError, match="--epochs 2 or more"):
        steady_speed(tmp_path)
