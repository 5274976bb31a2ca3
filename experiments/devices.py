"""Experiment 3: what 1 to 64 devices do to accuracy at a fixed epoch budget, under each learning-rate rule.

    python -m experiments.devices                                  # the default grid (about 40 min on 2 cores)
    python -m experiments.devices --devices 1,8,64 --rules none,linear --seeds 42 --epochs 2
    python -m experiments.devices --report_only                    # redraw table and plots from runs/devices

Every run is one process standing for N devices (``--virtual_devices N``) at the per-device batch. Writes
``devices.md``, ``devices.csv``, ``devices_runs.csv`` and ``devices.png`` into ``--out_dir``; the rules, the budget and
the results: docs/large_batch.md, "Experiment 3".
"""

import argparse
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks.tables import figure, write_csv
from experiments import runner
from experiments.runner import (Budget, RunResult, RunSpec, add_budget_arguments, budget_from, by_row, seed_stats,
                                spread, verdict_cell, write_report, write_runs_csv)

RULES = ("none", "linear", "sqrt", "warmup", "lars", "lamb", "novograd")
DEFAULT_RULES = ("none", "linear", "sqrt", "warmup", "lars", "lamb")
COLUMNS = ["devices", "rule", "effective batch", "lr", "optimizer steps", "final val acc", "best val acc",
           "diverged", "verdict"]


def rule_flags(rule: str, args) -> List[str]:
    """train.py flags of one rule."""
    sgd = ["--optimizer", "sgd", "--lr", f"{args.lr:g}"]
    return {
        "none": [*sgd, "--lr_scaling", "none"],
        "linear": [*sgd, "--lr_scaling", "linear"],
        "sqrt": [*sgd, "--lr_scaling", "sqrt"],
        "warmup": [*sgd, "--lr_scaling", "linear", "--warmup_epochs", f"{args.warmup_epochs:g}"],
        "lars": ["--optimizer", "lars", "--lr", f"{args.lars_lr:g}", "--lr_scaling", "linear"],
        "lamb": ["--optimizer", "lamb", "--lr", f"{args.lamb_lr:g}", "--lr_scaling", "sqrt"],
        "novograd": ["--optimizer", "novograd", "--model.optimizer.init_args.grad_averaging", "true", "--lr",
                     f"{args.novograd_lr:g}", "--lr_scaling", "sqrt"],
    }[rule]


def grid(devices: Sequence[int], rules: Sequence[str], seeds: Sequence[int], args) -> List[RunSpec]:
    return [RunSpec(f"n{n}_{rule}_s{seed}", devices=1, virtual=n, seed=seed, cell=rule,
                    flags=["--batch_size", str(args.batch_size), *rule_flags(rule, args)])
            for n in devices for rule in rules for seed in seeds]


def cells(results: Sequence[RunResult], margin: float) -> List[Dict]:
    """One row per (devices, rule), over its seeds."""
    rows = []
    for runs, seen in by_row(results, margin):
        s = next((r.summary for r in runs if r.summary), {})
        rows.append({
            "devices": runs[0].spec.virtual, "rule": runs[0].spec.row, "effective_batch": s.get("effective_batch_size"),
            "lr": s.get("scaled_lr"), "steps": s.get("total_steps"),
            "final": [r.final_acc for r in runs], "best": [r.best_acc for r in runs],
            "diverged": seen.count("diverged"), "runs": len(runs), "verdict": verdict_cell(seen),
        })
    return rows


def plot(rows: Sequence[Dict], path: Path, title: str) -> None:
    """Final val acc (median, range over seeds) against devices (left) and against optimizer steps (right)."""
    fig, (by_devices, by_steps) = figure()
    for rule in dict.fromkeys(row["rule"] for row in rows):
        mine = [row for row in rows if row["rule"] == rule]
        stats = [seed_stats(row["final"]) for row in mine]
        medians = [m if m is not None else float("nan") for m, _, _ in stats]
        low = [m - lo if m is not None else 0 for m, lo, _ in stats]
        high = [hi - m if m is not None else 0 for m, _, hi in stats]
        line = by_devices.errorbar([row["devices"] for row in mine], medians, yerr=[low, high], marker="o",
                                   capsize=3, label=rule)
        by_steps.plot([row["steps"] or float("nan") for row in mine], medians, marker="o",
                      color=line.lines[0].get_color(), label=rule)
        broke = [(row["devices"], row["steps"], m) for row, m in zip(mine, medians) if row["diverged"]]
        for axes, x in ((by_devices, 0), (by_steps, 1)):  # a cell where a seed diverged: its median is not a result
            axes.scatter([b[x] or float("nan") for b in broke], [0.1 if math.isnan(b[2]) else b[2] for b in broke],
                         marker="x", s=80, color="black", zorder=5)
    for axes, xlabel in ((by_devices, "devices (per-device batch fixed)"), (by_steps, "optimizer steps in the budget")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel(xlabel)
        axes.set_ylabel("final val acc (held-out images)")
        axes.grid(alpha=0.3)
        axes.legend(title="rule", fontsize=8)
    fig.suptitle(f"{title}; x: a seed diverged there (exit 70), drawn at its median or at chance")
    fig.savefig(path, dpi=90)


def write_outputs(results: Sequence[RunResult], budget: Budget, args, command: str, wall_s: Optional[float]) -> str:
    out = Path(args.out_dir)
    rows = cells(results, args.margin)
    table = [[str(r["devices"]), r["rule"], str(r["effective_batch"]), "n/a" if r["lr"] is None else f"{r['lr']:.4g}",
              str(r["steps"]), spread(r["final"]), spread(r["best"]), f"{r['diverged']}/{r['runs']}", r["verdict"]]
             for r in rows]
    images = f"the first {budget.train_subset:,}" if budget.train_subset else "all"
    text = write_report(
        out / "devices.md", command,
        f"Budget: `{budget.network}`, {args.batch_size} images per device, {budget.epochs} epochs on {images} "
        f"training images left after holding out {budget.val_size:,} for validation; seeds "
        f"{', '.join(str(s) for s in args.seeds)}; SGD momentum 0.9 at lr {args.lr:g} on one device "
        f"(LARS {args.lars_lr:g}, LAMB {args.lamb_lr:g}); warm-up {args.warmup_epochs:g} epoch(s). Accuracy: median "
        f"(min–max) over the seeds, on the held-out images, last epoch and best epoch; n/a: a seed without a finite "
        f"one.", COLUMNS, table, results, wall_s, budget, args.margin)
    write_csv(out / "devices.csv", ["devices", "rule", "effective_batch", "scaled_lr", "optimizer_steps",
                                    "final_val_acc_median", "final_val_acc_min", "final_val_acc_max",
                                    "best_val_acc_median", "diverged_runs", "runs", "verdict"],
              [[r["devices"], r["rule"], r["effective_batch"], r["lr"], r["steps"], *seed_stats(r["final"]),
                seed_stats(r["best"])[0], r["diverged"], r["runs"], r["verdict"]] for r in rows])
    write_runs_csv(out / "devices_runs.csv", results,
                   {"devices": lambda r: r.spec.virtual, "rule": lambda r: r.spec.row})
    plot(rows, out / "devices.png", f"Experiment 3: {budget.network}, {args.batch_size} per device, "
                                    f"{budget.epochs} epochs")
    return text


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m experiments.devices", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--devices", default="1,2,4,8,16,32,64", help="comma-separated virtual device counts")
    parser.add_argument("--rules", default=",".join(DEFAULT_RULES), help=f"comma-separated, of {', '.join(RULES)}")
    parser.add_argument("--batch_size", type=int, default=128, help="per device, the same for every run")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD's, known to work on one device")
    parser.add_argument("--lars_lr", type=float, default=0.5, help="LARS's on one device (trust coefficient 0.01)")
    parser.add_argument("--lamb_lr", type=float, default=0.005, help="LAMB's on one device")
    parser.add_argument("--novograd_lr", type=float, default=0.01, help="NovoGrad's on one device")
    parser.add_argument("--warmup_epochs", type=float, default=1.0, help="of the warmup rule")
    add_budget_arguments(parser, out_dir="runs/devices", epochs=3, train_subset=16384, target=0.8, each="cell")
    args = parser.parse_args(argv)
    bad = [r for r in args.rules.split(",") if r not in RULES]
    if bad:
        parser.error(f"--rules: unknown {', '.join(bad)}; choose from {', '.join(RULES)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    specs = grid([int(n) for n in args.devices.split(",")], args.rules.split(","), args.seeds, args)
    return runner.run_command("experiments.devices", argv, specs, budget_from(args), args, write_outputs)


if __name__ == "__main__":
    sys.exit(main())
