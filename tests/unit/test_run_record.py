"""``metrics.csv``: a resumed run keeps the rows before the step it resumes from and appends; the readers that
benchmarks and experiments use (read_run, read_latest) return what the file holds."""

import csv
import os
import time


from callbacks.run_record import FILE_NAME, MetricsCSV, read_epochs, read_latest, read_run


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
