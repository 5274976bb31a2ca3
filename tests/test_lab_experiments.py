"""Experiments 2 and 3 (experiments/takeaways.py, experiments/devices.py) run end to end on the tiny IDX data and a
one-epoch budget: the table's rows, columns and verdicts, and the files written."""

import csv
import statistics

import pytest

from callbacks.run_record import read_epochs
from experiments import devices, takeaways
from experiments.runner import Budget, RunSpec, run, verdicts
from tests.conftest import experiment_dir, run_dir
from tests.idx_files import write_fashion_mnist
from tests.unit.test_lab_experiments import result


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table_lines(markdown: str):
    return [line for line in markdown.splitlines() if line.startswith("| ")]


@pytest.mark.multiprocess
def test_takeaways_runs_the_workshop_rows_as_torchrun_nodes_and_writes_table_csvs_and_plot(tmp_path):
    """--ddp: 2 real processes, one per "node" (--max_ranks_per_node 1): the harness's torchrun path. 320 training
    images, so that each rank's shard holds the recipe's batch of 128 (a larger batch than a shard is refused)."""
    out, data = tmp_path / "takeaways", write_fashion_mnist(tmp_path / "data", n_train=320)
    code = takeaways.main(["--out_dir", str(out), "--data_dir", str(data), "--epochs", "2", "--devices", "2",
                           "--ddp", "--max_ranks_per_node", "1", "--only", "sgd,large_batch_warmup", "--seeds", "7",
                           "--val_size", "64", "--target", "0.3"])
    assert code == 0
    header, *rows = table_lines((out / "takeaways.md").read_text())
    assert header == "| " + " | ".join(takeaways.COLUMNS) + " |"
    assert [r.split(" | ")[0] for r in rows] == ["| sgd", "| large_batch_warmup"]
    records = read_csv(out / "takeaways.csv")
    assert [(r["config"], r["world_size"], r["effective_batch_size"], r["optimizer"], r["runs"]) for r in records] == [
        ("sgd", "2", "64", "sgd", "1"), ("large_batch_warmup", "2", "256", "sgd", "1")]
    # 320 training images less 64 held out, 128 per rank: 1 step of 128 per epoch; warm-up over half the 2 epochs
    warm = records[1]
    assert float(warm["scaled_lr"]) == pytest.approx(0.04) and warm["warmup_steps"] == "1"
    assert "| 2 × 128 = 256 | 0.01 @ 64 → 0.04 (linear) | 1 ep (1 steps) |" in rows[1]
    runs = read_csv(out / "takeaways_runs.csv")
    assert [(r["run"], r["seed"], r["exit_code"]) for r in runs] == [("sgd_s7", "7", "0"), ("large_batch_warmup_s7", "7", "0")]
    assert all(0 < float(r["best_val_acc"]) <= 1 and float(r["images_per_sec"]) > 0 for r in runs)
    assert "torch.distributed.run" in (out / "runs" / "sgd_s7" / "command.txt").read_text()
    assert (out / "takeaways.png").stat().st_size > 10_000
    # What the table read: each run's metrics.csv holds its 2 epochs, and the table's figures are theirs
    for row in runs:
        epochs = read_epochs(run_dir(out / "runs" / row["run"]))
        assert [e.epoch for e in epochs] == [1, 2] and all(e.cumulative_s > 0 for e in epochs), epochs
        assert float(row["final_val_acc"]) == pytest.approx(epochs[-1].val_acc)
        assert float(row["best_val_acc"]) == pytest.approx(max(e.val_acc for e in epochs))
        assert float(row["images_per_sec"]) == pytest.approx(statistics.median(e.images_per_sec for e in epochs))


def test_a_run_that_blows_up_is_diverged(fashion_root, tmp_path):
    budget = Budget(epochs=1, data_dir=str(fashion_root), timeout_s=240)
    blown = run(RunSpec("blowup", "sgd", 1, ["--lr", "1e30"]), budget, tmp_path, log=lambda *a, **k: None)
    assert blown.returncode == 70, blown.stderr_tail
    assert verdicts([result(), blown]) == ["converged", "diverged"]


@pytest.mark.multiprocess
def test_devices_runs_each_cell_per_seed_on_held_out_images_and_redraws_from_the_runs(fashion_root, tmp_path):
    """1 and 4 virtual devices x none/linear x 2 seeds, two runs at a time; then --report_only redraws the table."""
    out = tmp_path / "devices"
    argv = ["--out_dir", str(out), "--data_dir", str(fashion_root), "--epochs", "1", "--devices", "1,4",
            "--rules", "none,linear", "--seeds", "42,43", "--batch_size", "16", "--train_subset", "0",
            "--val_size", "64", "--target", "0.3"]
    assert devices.main(argv) == 0
    header, *rows = table_lines((out / "devices.md").read_text())
    assert header == "| " + " | ".join(devices.COLUMNS) + " |" and len(rows) == 4
    records = read_csv(out / "devices.csv")
    # 256 training images less 64 held out: 12 steps of 16 on one device, 3 of 64 on four
    assert [(r["devices"], r["rule"], r["effective_batch"], r["scaled_lr"], r["optimizer_steps"], r["runs"])
            for r in records] == [("1", "none", "16", "0.05", "12", "2"), ("1", "linear", "16", "0.05", "12", "2"),
                                  ("4", "none", "64", "0.05", "3", "2"), ("4", "linear", "64", "0.2", "3", "2")]
    runs = read_csv(out / "devices_runs.csv")
    assert sorted((r["run"], r["seed"], r["exit_code"]) for r in runs)[:2] == [("n1_linear_s42", "42", "0"),
                                                                              ("n1_linear_s43", "43", "0")]
    assert all(0 < float(r["final_val_acc"]) <= 1 for r in runs)
    assert "--virtual_devices 4" in (out / "runs" / "n4_linear_s43" / "command.txt").read_text()
    assert (out / "devices.png").stat().st_size > 10_000

    table = (out / "devices.md").read_text()
    (out / "devices.md").unlink()
    assert devices.main([*argv, "--report_only"]) == 0
    redrawn = (out / "devices.md").read_text()
    assert table_lines(redrawn) == table_lines(table) and "Wall time" in table and "Wall time" not in redrawn
