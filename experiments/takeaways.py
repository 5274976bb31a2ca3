"""Experiment 2, the DLI workshop's takeaways table, on a batch-normalised conv net.

    python -m experiments.takeaways                  # every row x 3 seeds (about 31 min on 2 cores)
    python -m experiments.takeaways --seeds 42 --only sgd_momentum,large_batch_warmup --epochs 2
    python -m experiments.takeaways --report_only    # redraw table and plot from runs/takeaways

Each row is ``train.py`` with a recipe from configs/recipes on one budget, one process standing for ``--devices`` (4)
virtual devices or, with ``--ddp``, that many gloo processes; the two large-batch rows run again at
``--scale_devices`` (40). Writes ``takeaways.md``, ``.csv``, ``_runs.csv``, ``.png`` and ``runs/<run>/`` into
``--out_dir``; the rows, the budget and the results: docs/large_batch.md, "Experiment 2".
"""

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from benchmarks.tables import write_csv
from experiments import runner
from experiments.runner import (Budget, RunResult, RunSpec, add_budget_arguments, budget_from, by_row, lr_cell,
                                plot_curves, seed_stats, spread, verdict_cell, warmup_cell, write_report,
                                write_runs_csv)

COLUMNS = ["config", "devices × batch = effective", "LR (base → scaled, rule)", "warm-up", "optimizer",
           "optimizer steps", "final val acc", "best val acc", "epoch to target", "verdict (seeds)"]


def rows(budget: Budget, scale: int) -> List[tuple]:
    """(row name, recipe, devices or None for ``--devices``, extra flags): docs/large_batch.md, Experiment 2."""
    half = f"{budget.epochs / 2:g}"
    return [
        ("sgd", "sgd", None, []),
        ("sgd_momentum", "sgd_momentum", None, []),
        ("large_batch_no_warmup", "large_batch_no_warmup", None, []),
        ("large_batch_warmup", "large_batch_warmup", None, ["--warmup_epochs", half]),
        ("novograd", "novograd", None, []),
        (f"large_batch_no_warmup_x{scale}", "large_batch_warmup", scale, ["--warmup_epochs", "0"]),
        (f"large_batch_warmup_x{scale}", "large_batch_warmup", scale, ["--warmup_epochs", half]),
    ]


def grid(budget: Budget, devices: int, scale: int, seeds: Sequence[int], ddp: bool,
         only: Optional[Sequence[str]] = None) -> List[RunSpec]:
    """Every wanted row once per seed: virtual devices in one process, or (``ddp``) as many real processes."""
    specs = []
    for name, recipe, n, flags in rows(budget, scale):
        if only and name not in only:
            continue
        n = n or devices
        for seed in seeds:
            placed = dict(devices=n) if ddp else dict(devices=1, virtual=n)
            specs.append(RunSpec(f"{name}_s{seed}", recipe, flags=list(flags), seed=seed, cell=name, **placed))
    return specs


def optimizer_cell(summary: dict) -> str:
    """``sgd, momentum 0.9``: the workshop's first two rows differ only there."""
    name = summary.get("optimizer", "n/a")
    if name in ("sgd", "lars") and "momentum" in summary:
        return f"{name}, momentum {summary['momentum']:g}"
    return name


def epochs_to_target(runs: Sequence[RunResult], target: float) -> str:
    """The median over seeds of the first epoch at or above ``target``; the seeds that never got there counted."""
    hits = [r.to_target(target) for r in runs]
    reached = [h["epoch"] for h in hits if h]
    if not reached:
        return "not reached"
    median = f"{seed_stats(reached)[0]:g}"
    return median if len(reached) == len(runs) else f"{median} ({len(runs) - len(reached)}/{len(runs)} never)"


def table(results: Sequence[RunResult], budget: Budget, margin: float) -> List[dict]:
    """One dict per row: its cells, its seeds' runs and verdicts."""
    out = []
    for runs, seen in by_row(results, margin):
        s = next((r.summary for r in runs if r.summary), {})
        spec = runs[0].spec
        devices = s.get("world_size", 1) * s.get("virtual_devices", 1) if s else max(spec.devices, spec.virtual)
        batch = f"{s['batch_size_per_device']} = {s['effective_batch_size']}" if s else "? = ?"
        cells = [spec.row, f"{devices} × {batch}", lr_cell(s), warmup_cell(s), optimizer_cell(s),
                 str(s.get("total_steps", "n/a")), spread([r.final_acc for r in runs]),
                 spread([r.best_acc for r in runs]), epochs_to_target(runs, budget.target), verdict_cell(seen)]
        out.append({"cells": cells, "runs": runs, "seen": seen, "summary": s})
    return out


def write_outputs(results: Sequence[RunResult], budget: Budget, args, command: str, wall_s: Optional[float]) -> str:
    out = Path(args.out_dir)
    rows_ = table(results, budget, args.margin)
    images = f"the first {budget.train_subset:,}" if budget.train_subset else "all"
    placed = "real gloo processes (ddp)" if args.ddp else "virtual devices in one process"
    text = write_report(
        out / "takeaways.md", command,
        f"Budget: `{budget.network}`, {budget.epochs} epochs on {images} training images left after holding out "
        f"{budget.val_size:,} for validation; devices are {placed}; seeds {', '.join(map(str, args.seeds))}. Val acc "
        f"on the held-out images: median (min–max) over the seeds, last epoch and best epoch; epoch to target: the "
        f"first epoch at val acc {budget.target:g} or above (median).", COLUMNS, [r["cells"] for r in rows_],
        results, wall_s, budget, args.margin)
    summary_keys = ("world_size", "virtual_devices", "batch_size_per_device", "effective_batch_size", "base_lr",
                    "scaled_lr", "lr_scaling", "warmup_steps", "total_steps", "optimizer", "momentum")
    write_csv(out / "takeaways.csv",
              ["config", *summary_keys, "final_val_acc_median", "final_val_acc_min", "final_val_acc_max",
               "best_val_acc_median", "diverged_runs", "runs", "verdict"],
              [[r["cells"][0], *(r["summary"].get(k) for k in summary_keys),
                *seed_stats([x.final_acc for x in r["runs"]]), seed_stats([x.best_acc for x in r["runs"]])[0],
                r["seen"].count("diverged"), len(r["runs"]), r["cells"][-1]] for r in rows_])
    write_runs_csv(out / "takeaways_runs.csv", [x for r in rows_ for x in r["runs"]], {"config": lambda x: x.spec.row},
                   [v for r in rows_ for v in r["seen"]])
    plot_curves(results, [r.spec.row for r in results], out / "takeaways.png",
                f"Workshop recipes, {budget.network}, {budget.epochs} epochs, held-out validation", budget.target)
    return text


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m experiments.takeaways", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--devices", type=int, default=4, help="devices of the workshop's rows (its 4 GPUs)")
    parser.add_argument("--scale_devices", type=int, default=40, help="devices of the last two rows")
    parser.add_argument("--ddp", action="store_true",
                        help="real processes (gloo) instead of virtual devices; beyond --max_ranks_per_node as "
                             "torchrun 'nodes' on 127.0.0.1")
    parser.add_argument("--only", default=None, help="comma-separated row names (sgd,sgd_momentum,...); default all")
    add_budget_arguments(parser, out_dir="runs/takeaways", epochs=5, train_subset=0, target=0.88, each="row")
    args = parser.parse_args(argv)
    if args.only:
        known = [name for name, *_ in rows(budget_from(args), args.scale_devices)]
        args.only = args.only.split(",")
        unknown = [name for name in args.only if name not in known]
        if unknown:
            parser.error(f"--only: no row {', '.join(unknown)} (rows: {', '.join(known)})")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    budget = budget_from(args)
    specs = grid(budget, args.devices, args.scale_devices, args.seeds, args.ddp, args.only)
    return runner.run_command("experiments.takeaways", argv, specs, budget, args, write_outputs)


if __name__ == "__main__":
    sys.exit(main())
