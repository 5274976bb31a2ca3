"""Experiment 3: what adding devices does to validation accuracy, for each LR scaling rule.

    python -m experiments.devices                         # 1, 2, 4 processes x none, linear, sqrt
    python -m experiments.devices --processes 1,2 --rules none,linear --epochs 2

The per-device batch is fixed (``--batch_size``, default 64), so N processes train on an
effective batch of N × 64 and take 1/N of the optimizer steps per epoch. ``--lr`` is the
learning rate known to work on one process at that batch; each rule scales it to the
effective batch: none (×1), linear (×N), sqrt (×√N). Everything else is the
``sgd_momentum`` recipe (SGD, momentum 0.9, no warm-up) with the budget's network, epochs and
training subset, as in experiments/takeaways.py. Default budget: ``mlp``, 4 epochs of the
first 20,000 training images, target val acc 0.82.

Processes are ddp ranks over gloo on CPU, one ``train.py --strategy ddp --devices N``
(experiments/runner.py). More processes than cores share the cores: their seconds show
contention, not scaling.

Writes into ``--out_dir``: ``devices.md`` (table), ``devices.csv``, ``devices.png`` (final val
acc and seconds to target against processes, one line per rule), ``devices_curves.png`` (val
acc against epoch and seconds for every run) and ``runs/<run>/``.
"""

import argparse
import math
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from experiments.runner import (Budget, RunResult, RunSpec, add_budget_arguments, budget_from, command_line,
                                data_text, exit_status, figure, fmt, lr_cell, plot_curves, run_all,
                                report_text, target_fields, to_target_cell, verdicts, write_csv)

RULES = ("none", "linear", "sqrt")
COLUMNS = ["processes", "rule", "effective batch", "LR (base → scaled)", "final val acc", "best val acc",
           "epoch / s to target", "images/sec", "verdict"]


def grid(processes: Sequence[int], rules: Sequence[str], batch_size: int, lr: float) -> List[RunSpec]:
    return [RunSpec(f"p{n}_{rule}", "sgd_momentum", n,
                    ["--batch_size", str(batch_size), "--lr", f"{lr:g}", "--lr_scaling", rule])
            for n in processes for rule in rules]


def table_rows(results: Sequence[RunResult], budget: Budget, margin: float) -> List[List[str]]:
    rows = []
    for result, verdict in zip(results, verdicts(results, margin)):
        s = result.summary
        rows.append([str(result.spec.devices), s.get("lr_scaling", "n/a"), str(s.get("effective_batch_size", "n/a")),
                     lr_cell(s).replace(" (" + str(s.get("lr_scaling")) + ")", ""), fmt(result.final_acc),
                     fmt(result.best_acc), to_target_cell(result, budget.target),
                     fmt(result.median_images_per_sec, ".0f"), verdict])
    return rows


def plot_summary(results: Sequence[RunResult], budget: Budget, path: Path) -> None:
    """Final val acc (left) and seconds to target (right) against processes, one line per rule."""
    fig, (acc_axes, time_axes) = figure()
    rules = [r for r in RULES if any(res.summary.get("lr_scaling") == r for res in results)]
    for rule in rules:
        mine = sorted((r for r in results if r.summary.get("lr_scaling") == rule), key=lambda r: r.spec.devices)
        xs = [r.spec.devices for r in mine]
        acc = [r.final_acc if r.final_acc is not None and math.isfinite(r.final_acc) else float("nan") for r in mine]
        line, = acc_axes.plot(xs, acc, marker="o", label=rule)
        hits = [r.to_target(budget.target) for r in mine]
        time_axes.plot(xs, [h["cumulative_s"] if h else float("nan") for h in hits], marker="o",
                       color=line.get_color(), label=rule)
    processes = sorted({r.spec.devices for r in results})
    for axes, ylabel in ((acc_axes, f"final val acc (epoch {budget.epochs})"),
                         (time_axes, f"training seconds to val acc {budget.target:g}")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(processes, [str(p) for p in processes])
        axes.set_xlabel("processes (ddp ranks, fixed per-device batch)")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
        axes.legend(title="LR rule", fontsize=8)
    time_axes.set_title("missing point: target not reached", fontsize=8)
    fig.suptitle(f"Adding processes at a fixed per-device batch: {budget.network}, {budget.epochs} epochs")
    fig.savefig(path, dpi=90)


def write_outputs(results: Sequence[RunResult], budget: Budget, out_dir: Path, margin: float, command: str,
                  wall_s: float, batch_size: int, lr: float) -> str:
    rows = table_rows(results, budget, margin)
    budget_line = (f"Budget: {data_text(budget)}, {batch_size} images per process, lr {lr:g} known at that batch on "
                   f"one process, SGD with momentum 0.9, no warm-up; validation on the 10,000 test images after every "
                   f"epoch; target val acc {budget.target:g}. Total wall time {wall_s / 60:.1f} min.")
    text = report_text(command, budget_line, COLUMNS, rows, margin)
    (out_dir / "devices.md").write_text(text)
    write_csv(out_dir / "devices.csv",
              ["run", "processes", "lr_scaling", "effective_batch", "base_lr", "scaled_lr", "exit_code",
               "final_val_acc", "best_val_acc", "epoch_to_target", "seconds_to_target", "images_per_sec", "wall_s",
               "verdict"],
              [[r.spec.name, r.spec.devices, *(r.summary.get(k) for k in (
                  "lr_scaling", "effective_batch_size", "base_lr", "scaled_lr")), r.returncode, r.final_acc,
                r.best_acc, *target_fields(r, budget.target), r.median_images_per_sec, round(r.wall_s, 1), row[-1]]
               for r, row in zip(results, rows)])
    plot_summary(results, budget, out_dir / "devices.png")
    plot_curves(results, [r.spec.name for r in results], out_dir / "devices_curves.png",
                f"Every run of experiment 3 ({budget.network}, {batch_size} per process)", budget.target)
    return text


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m experiments.devices", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--processes", default="1,2,4", help="comma-separated ddp world sizes")
    parser.add_argument("--rules", default=",".join(RULES), help="comma-separated LR scaling rules")
    parser.add_argument("--batch_size", type=int, default=64, help="per process, the same for every run")
    parser.add_argument("--lr", type=float, default=0.02, help="known to work on one process at --batch_size")
    add_budget_arguments(parser, out_dir="runs/devices", epochs=4, train_subset=20000, target=0.82)
    args = parser.parse_args(argv)
    bad = [r for r in args.rules.split(",") if r not in RULES]
    if bad:
        parser.error(f"--rules: unknown {', '.join(bad)}; choose from {', '.join(RULES)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    budget = budget_from(args)
    specs = grid([int(p) for p in args.processes.split(",")], args.rules.split(","), args.batch_size, args.lr)
    results, wall_s = run_all(specs, budget, Path(args.out_dir), args.max_ranks_per_node)
    print(write_outputs(results, budget, Path(args.out_dir), args.margin, command_line("experiments.devices", argv),
                        wall_s, args.batch_size, args.lr))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
