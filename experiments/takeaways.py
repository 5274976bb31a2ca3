"""Experiment 2, the DLI workshop's takeaways table: its recipes, one fixed budget, one table.

    python -m experiments.takeaways                       # the grid below: 2 processes, mlp, 5 epochs, 60,000 images
    python -m experiments.takeaways --epochs 2 --train_subset 10000 --only sgd,novograd --devices 1,2

Each row is the real ``train.py`` with a recipe from configs/recipes stacked with the
budget's flags (experiments/runner.py): ``--accelerator cpu``, ``--strategy ddp --devices N``
(gloo), the budget's ``--network``, ``--epochs`` and ``--data.train_subset``. The rows are
the workshop's runs, in its order:

* ``sgd``: WideResNet recipe's plain SGD, 32 images per device, lr 0.01, no momentum;
* ``sgd_momentum``: the same with momentum 0.9;
* ``large_batch_no_warmup``: 128 per device, lr 0.08 from the first step;
* ``large_batch_warmup``: 128 per device, linear scaling of lr 0.01 known at batch 32 (the
  workshop's 4 GPUs × 128 reached 0.08 from 0.01 at 64; here ``--model.base_batch_size 32`` so
  2 devices × 128 reach the same 0.08 as the row above), warm-up over half the epochs (the
  recipe's 5 of 10);
* ``novograd``: 128 per device, NovoGrad at lr 0.08.

Default budget (about 7 minutes on a shared 2-core CPU): the ``mlp`` network (784-256-10: the
cnn trains at 70-600 images/sec on 2 cores, the mlp at thousands), 5 epochs of all 60,000
training images, validation on the 10,000 test images after each epoch, target val acc 0.85.
``--devices 1,2`` repeats the grid for each process count. Writes into ``--out_dir``:
``takeaways.md`` (the table and the verdict rules), ``takeaways.csv``, ``takeaways.png``
(val acc against epoch and against training seconds) and ``runs/<row>/`` (each run's
command, output, TensorBoard logs, time_to_accuracy.csv).
"""

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from experiments.runner import (
    Budget,
    RunResult,
    RunSpec,
    add_budget_arguments,
    budget_from,
    command_line,
    data_text,
    exit_status,
    fmt,
    lr_cell,
    plot_curves,
    report_text,
    run_all,
    target_fields,
    to_target_cell,
    verdicts,
    warmup_cell,
    write_csv,
)

COLUMNS = ["config", "devices × batch = effective", "LR (base → scaled, rule)", "warm-up", "optimizer",
           "best val acc", "epoch / s to target", "images/sec", "verdict"]


def grid(budget: Budget, devices: Sequence[int] = (2,)) -> List[RunSpec]:
    """The workshop's runs (module docstring) for each process count."""
    warmup = f"{budget.epochs / 2:g}"
    rows = [
        ("sgd", "sgd", []),
        ("sgd_momentum", "sgd_momentum", []),
        ("large_batch_no_warmup", "large_batch_no_warmup", []),
        ("large_batch_warmup", "large_batch_warmup", ["--model.base_batch_size", "32", "--warmup_epochs", warmup]),
        ("novograd", "novograd", []),
    ]
    suffix = len(devices) > 1
    return [RunSpec(f"{name}_x{n}" if suffix else name, recipe, n, list(flags))
            for n in devices for name, recipe, flags in rows]


def optimizer_cell(summary: dict) -> str:
    """``sgd, momentum 0.9``: the workshop's first two rows differ only there."""
    name = summary.get("optimizer", "n/a")
    if name in ("sgd", "lars") and "momentum" in summary:
        return f"{name}, momentum {summary['momentum']:g}"
    return name


def table_rows(results: Sequence[RunResult], budget: Budget, margin: float) -> List[List[str]]:
    rows = []
    for result, verdict in zip(results, verdicts(results, margin)):
        s = result.summary
        batch = (f"{s['world_size']} × {s['batch_size_per_device']} = {s['effective_batch_size']}" if s
                 else f"{result.spec.devices} × ? = ?")
        rows.append([result.spec.name, batch, lr_cell(s), warmup_cell(s), optimizer_cell(s),
                     fmt(result.best_acc), to_target_cell(result, budget.target),
                     fmt(result.median_images_per_sec, ".0f"), verdict])
    return rows


def write_outputs(results: Sequence[RunResult], budget: Budget, out_dir: Path, margin: float, command: str,
                  wall_s: float) -> str:
    rows = table_rows(results, budget, margin)
    budget_line = (f"Budget: {data_text(budget)}, validation on the 10,000 test images after every epoch; target "
                   f"val acc {budget.target:g}. Total wall time {wall_s / 60:.1f} min.")
    text = report_text(command, budget_line, COLUMNS, rows, margin)
    (out_dir / "takeaways.md").write_text(text)
    write_csv(out_dir / "takeaways.csv",
              ["config", "devices", "batch_per_device", "effective_batch", "base_lr", "scaled_lr", "lr_scaling",
               "warmup_steps", "optimizer", "momentum", "exit_code", "best_val_acc", "final_val_acc",
               "epoch_to_target", "seconds_to_target", "images_per_sec", "wall_s", "verdict"],
              [[r.spec.name, r.spec.devices, *(r.summary.get(k) for k in (
                  "batch_size_per_device", "effective_batch_size", "base_lr", "scaled_lr", "lr_scaling", "warmup_steps",
                  "optimizer", "momentum")), r.returncode, r.best_acc, r.final_acc, *target_fields(r, budget.target),
                r.median_images_per_sec, round(r.wall_s, 1), row[-1]] for r, row in zip(results, rows)])
    plot_curves(results, [r.spec.name for r in results], out_dir / "takeaways.png",
                f"Workshop recipes, {budget.network}, {budget.epochs} epochs, {budget.train_subset or 60000:,} training images",
                budget.target)
    return text


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m experiments.takeaways", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--devices", default="2", help="comma-separated process counts; the grid runs for each")
    parser.add_argument("--only", default=None, help="comma-separated row names (sgd,sgd_momentum,...); default all")
    add_budget_arguments(parser, out_dir="runs/takeaways", epochs=5, train_subset=0, target=0.85)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    budget = budget_from(args)
    specs = grid(budget, [int(d) for d in args.devices.split(",")])
    if args.only:
        wanted = set(args.only.split(","))
        specs = [s for s in specs if s.name in wanted or s.name.rsplit("_x", 1)[0] in wanted]
        if not specs:
            print(f"--only {args.only}: no such row (rows: {', '.join(r.name for r in grid(budget))})", file=sys.stderr)
            return 2
    results, wall_s = run_all(specs, budget, Path(args.out_dir), args.max_ranks_per_node)
    print(write_outputs(results, budget, Path(args.out_dir), args.margin, command_line("experiments.takeaways", argv),
                        wall_s))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
