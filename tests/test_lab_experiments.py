"""Experiments 2 and 3 (experiments/takeaways.py, experiments/devices.py) run end to end on the tiny IDX data and a
one-epoch budget: the table's rows, columns and verdicts, and the files written."""

import csv

import pytest

from experiments import devices, takeaways
from experiments.runner import Budget, RunSpec, run, verdicts
from tests.unit.test_lab_experiments import result


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table_lines(markdown: str):
    return [line for line in markdown.splitlines() if line.startswith("| ")]


@pytest.mark.multiprocess
def test_takeaways_runs_the_workshop_rows_and_writes_table_csv_and_plot(fashion_root, tmp_path):
    out = tmp_path / "takeaways"
    code = takeaways.main(["--out_dir", str(out), "--data_dir", str(fashion_root), "--epochs", "2", "--devices", "1",
                           "--only", "sgd,large_batch_warmup", "--target", "0.3"])
    assert code == 0
    header, *rows = table_lines((out / "takeaways.md").read_text())
    assert header == "| " + " | ".join(takeaways.COLUMNS) + " |"
    assert [r.split(" | ")[0] for r in rows] == ["| sgd", "| large_batch_warmup"]
    records = read_csv(out / "takeaways.csv")
    assert [(r["config"], r["effective_batch"], r["optimizer"]) for r in records] == [
        ("sgd", "32", "sgd"), ("large_batch_warmup", "128", "sgd")]
    warm = records[1]  # linear from 0.01 at batch 32 to 128, over half of the 2 epochs: 1 epoch of 2 steps
    assert float(warm["scaled_lr"]) == pytest.approx(0.04) and warm["warmup_steps"] == "2"
    assert "1 ep (2 steps)" in rows[1] and "0.01 @ 32 → 0.04 (linear)" in rows[1]
    assert {r["verdict"] for r in records} <= {"converged", "degraded"} and "converged" in {r["verdict"] for r in records}
    assert all(0 < float(r["best_val_acc"]) <= 1 and float(r["images_per_sec"]) > 0 for r in records)
    assert (out / "takeaways.png").stat().st_size > 10_000
    assert (out / "runs" / "sgd" / "runs" / "fashion_mnist" / "version_0" / "time_to_accuracy.csv").is_file()


def test_a_run_that_blows_up_is_diverged(fashion_root, tmp_path):
    budget = Budget(epochs=1, data_dir=str(fashion_root), timeout_s=240)
    blown = run(RunSpec("blowup", "sgd", 1, ["--lr", "1e30"]), budget, tmp_path, log=lambda *a, **k: None)
    assert blown.returncode == 70, blown.stderr_tail
    assert verdicts([result(), blown]) == ["converged", "diverged"]


@pytest.mark.multiprocess
def test_devices_runs_each_process_count_and_writes_table_and_plots(fashion_root, tmp_path):
    """2 processes with one rank per "node" (--max_ranks_per_node 1): the torchrun path of the harness."""
    out = tmp_path / "devices"
    code = devices.main(["--out_dir", str(out), "--data_dir", str(fashion_root), "--epochs", "1", "--processes", "1,2",
                         "--rules", "linear", "--batch_size", "32", "--max_ranks_per_node", "1", "--target", "0.3"])
    assert code == 0
    header, *rows = table_lines((out / "devices.md").read_text())
    assert header == "| " + " | ".join(devices.COLUMNS) + " |" and len(rows) == 2
    records = read_csv(out / "devices.csv")
    assert [(r["processes"], r["effective_batch"], r["scaled_lr"]) for r in records] == [
        ("1", "32", "0.02"), ("2", "64", "0.04")]
    assert all(r["epoch_to_target"] == "1" and r["verdict"] in ("converged", "degraded") for r in records)
    assert "| 2 | linear | 64 | 0.02 @ 32 → 0.04 |" in rows[1]
    assert "torch.distributed.run" in (out / "runs" / "p2_linear" / "command.txt").read_text()
    for name in ("devices.png", "devices_curves.png"):
        assert (out / name).stat().st_size > 10_000
