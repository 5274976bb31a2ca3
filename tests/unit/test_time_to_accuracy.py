"""time_to_accuracy.png is drawn from metrics.csv when training ends: every epoch's accuracy is in it, also when the
logger's write timer held the last rows back and no checkpoint wrote them."""

import callbacks.time_to_accuracy as time_to_accuracy
from callbacks.run_record import MetricsCSV
from callbacks.time_to_accuracy import TimeToAccuracy
from tests.unit.conftest import tiny_fit


def test_the_plot_has_every_epoch_when_no_checkpoint_wrote_the_last_rows(fashion_root, tmp_path, monkeypatch):
    drawn = []

    def plot(path, records, target=None):
        drawn.append(records)

    monkeypatch.setattr(time_to_accuracy, "plot", plot)
    logger = MetricsCSV(str(tmp_path), name="run", version=0, write_every_s=3600)  # the timer never fires again
    tiny_fit(fashion_root, tmp_path, [TimeToAccuracy()], logger=logger, max_epochs=3, log_every_n_steps=2)
    (records,) = drawn
    assert [record.epoch for record in records] == [1, 2, 3]
    assert all(record.val_acc is not None for record in records)
