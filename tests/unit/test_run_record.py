"""``metrics.csv``: a resumed run keeps the rows before the step it resumes from and appends; rows are on disk at
every checkpoint and at most ``write_every_s`` late otherwise; the readers that benchmarks and experiments use
(read_run, read_latest) return what the file holds."""

import csv
import os
import time

from lightning.pytorch import Callback

from callbacks.run_record import FILE_NAME, MetricsCSV, RunRecord, read_epochs, read_latest, read_rows, read_run
from tests.unit.conftest import tiny_fit


def write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def test_a_resumed_run_drops_the_rows_from_its_resume_step_on_and_appends(tmp_path):
    """Resumed from step 8 (TensorBoard's purge_step): the first run's rows at steps 3 and 7 stay, those at 8 and 12
    (trained again after the resume) go; the new rows follow."""
    path = tmp_path / "mlp" / "version_0" / FILE_NAME
    write_csv(path, [{"step": 3, "epoch": 0, "train/loss": 1.0}, {"step": 7, "epoch": 0, "val/acc": 0.5},
                     {"step": 8, "epoch": 1, "train/loss": 0.9}, {"step": 12, "epoch": 1, "val/acc": 0.6}])
    record = MetricsCSV(str(tmp_path), name="mlp", version=0, purge_step=8)
    record.log_metrics({"epoch": 1, "train/loss": 0.7}, step=9)
    record.save()
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["step"], row["train/loss"], row["val/acc"]) for row in rows] == [
        ("3", "1.0", ""), ("7", "", "0.5"), ("9", "0.7", "")]
    assert list(rows[0]) == ["step", "epoch", "train/loss", "val/acc"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_new_run_in_an_empty_folder_starts_the_file(tmp_path):
    record = MetricsCSV(str(tmp_path), name="mlp", version=0)
    record.log_metrics({"epoch": 0, "val/acc": 0.25}, step=4)
    record.finalize("success")
    assert read_latest(tmp_path / "mlp" / "version_0") == {"step": 4.0, "epoch": 0.0, "val/acc": 0.25}


def test_between_writes_the_rows_wait_for_write_every_s_or_write_now(tmp_path):
    record = MetricsCSV(str(tmp_path), name="mlp", version=0, write_every_s=3600)
    path = tmp_path / "mlp" / "version_0" / FILE_NAME
    record.log_metrics({"epoch": 0, "train/loss": 1.0}, step=1)
    record.save()  # the first save writes
    record.log_metrics({"epoch": 0, "train/loss": 0.9}, step=3)
    record.save()  # an hour has not passed: the row waits
    assert [row["step"] for row in read_rows(path)] == ["1"]
    record.write_now()
    assert [row["step"] for row in read_rows(path)] == ["1", "3"]
    record.write_every_s = 0.0
    record.log_metrics({"epoch": 0, "train/loss": 0.8}, step=5)
    record.save()
    assert [row["step"] for row in read_rows(path)] == ["1", "3", "5"]


class SaveAtBatch(Callback):
    """Writes a checkpoint at the end of batch ``batch``; keeps metrics.csv's steps just before and just after."""

    def __init__(self, batch, path):
        self.batch, self.path, self.steps = batch, path, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == self.batch:
            before = read_rows(trainer.logger.path)
            trainer.save_checkpoint(self.path)
            self.steps = ([row["step"] for row in before], [row["step"] for row in read_rows(trainer.logger.path)],
                          [str(row["step"]) for row in trainer.logger.rows])


def test_every_row_logged_before_a_checkpoint_is_on_disk_with_it(fashion_root, tmp_path):
    """RunRecord writes the rows at every checkpoint, so a run resumed from it never lacks one before its step."""
    logger = MetricsCSV(str(tmp_path), name="run", version=0, write_every_s=3600)
    save = SaveAtBatch(6, tmp_path / "mid.ckpt")
    tiny_fit(fashion_root, tmp_path, [RunRecord(), save], logger=logger, log_every_n_steps=2, limit_val_batches=0)
    before, after, logged = save.steps
    assert len(before) < len(logged) == 3  # the timer held rows back (steps 1, 3, 5: one a log step)
    assert after == logged


def test_read_run_reads_the_newest_runs_epochs_and_test_figures(tmp_path):
    runs = tmp_path / "runs"
    old = runs / "mlp-single-1x32-sgd" / "version_0" / FILE_NAME
    write_csv(old, [{"step": 4, "epoch": 0, "test/acc": 0.1}])
    past = time.time() - 60
    os.utime(old, (past, past))
    write_csv(runs / "cnn-single-1x32-sgd" / "version_3" / FILE_NAME, [
        {"step": 4, "epoch": 0, "time/cumulative_s": 1.5, "throughput/images_per_sec": 100.0},
        {"step": 4, "epoch": 0, "val/loss": 0.9, "val/acc": 0.7},
        {"step": 8, "epoch": 1, "time/cumulative_s": 3.0, "throughput/images_per_sec": 110.0, "val/acc": 0.8},
        {"step": 8, "test/acc": 0.75, "test/loss": 0.6}])
    results = read_run(runs)
    assert results.folder == runs / "cnn-single-1x32-sgd" / "version_3"
    assert [(e.epoch, e.cumulative_s, e.images_per_sec, e.val_loss, e.val_acc) for e in results.epochs] == [
        (1, 1.5, 100.0, 0.9, 0.7), (2, 3.0, 110.0, None, 0.8)]
    assert results.test == {"test/acc": 0.75, "test/loss": 0.6}
    assert results.latest["val/acc"] == 0.8 and results.latest["step"] == 8.0
    assert read_epochs(results.folder) == results.epochs
    empty = read_run(tmp_path / "nothing")
    assert empty.folder is None and empty.epochs == [] and empty.test == {}
