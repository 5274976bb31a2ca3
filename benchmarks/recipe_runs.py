"""Time to accuracy of a recipe: run it N times (seeds 42, 43, ...) and quote the median and the spread.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.recipe_runs configs/recipes/fast_cpu.yaml [--runs 3]

Each run is ``train.py --config RECIPE --seed S [FLAGS after --]`` in a scratch folder, read back from its record
(training seconds: the last epoch's cumulative time; test accuracy: the test after fit). ``--against OLD.yaml`` runs
the two recipes alternately (old 42, new 42, old 43, ...) and prints the ratio of their median training times.
``--against-plain`` alternates the recipe with the plain loop (benchmarks/plain_loop.py: plain 42, recipe 42, plain
43, ...) and prints each seed's training time against the plain loop's: the CPU record's budget, run by run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.speed import machine
from benchmarks import launch
from benchmarks.tables import markdown_table

PLAIN = "plain loop"  # the name of benchmarks/plain_loop.py's rows in a series


def one_run(recipe: str, seed: int, extra) -> dict:
    started, load = time.perf_counter(), os.getloadavg()[0]
    record = launch.train_record(["--config", str(Path(recipe).resolve()), "--seed", str(seed), *extra], 3600)
    wall = time.perf_counter() - started
    epochs = [e for e in record.epochs if e.cumulative_s is not None]
    return {"seed": seed, "epochs": len(epochs), "train_s": epochs[-1].cumulative_s,
            "first_step_s": record.latest.get("time/first_step_s", float("nan")),
            "images_per_sec": statistics.median(e.images_per_sec for e in epochs), "val_acc": epochs[-1].val_acc,
            "test_acc": record.test.get("test/acc", float("nan")), "wall_s": wall, "load": load}


def plain_run(seed: int, timeout_s: float = 3600) -> dict:
    """benchmarks/plain_loop.py for ``seed`` in its own process, with torch's own thread count (as the recipe's runs):
    its JSON line read back."""
    env = launch.clean_env(keep_data_dir=True)
    env.pop("OMP_NUM_THREADS")
    started, load = time.perf_counter(), os.getloadavg()[0]
    finished = subprocess.run([sys.executable, "-m", "benchmarks.plain_loop", "--seed", str(seed)], cwd=launch.REPO,
                              env=env, capture_output=True, text=True, timeout=timeout_s)
    if finished.returncode != 0:
        raise SystemExit(f"benchmarks/plain_loop.py --seed {seed} exited {finished.returncode}:\n"
                         f"{finished.stderr[-3000:]}")
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    return {**result, "val_acc": None, "wall_s": time.perf_counter() - started, "load": load}


def run_with_plain(recipe: str, seed: int, extra) -> dict:
    return plain_run(seed) if recipe == PLAIN else one_run(recipe, seed, extra)


def fraction(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def print_table(recipe: str, extra, rows) -> None:
    print(f"\n{recipe} {' '.join(extra)}; {machine()}\n")
    print(markdown_table(["seed", "epochs", "training s", "first step s", "images/sec", "test acc", "wall s", "load"], [
        [str(r["seed"]), str(r["epochs"]), f"{r['train_s']:.2f}", f"{r.get('first_step_s', float('nan')):.2f}",
         f"{r['images_per_sec']:.0f}", fraction(r["test_acc"]), f"{r['wall_s']:.0f}", f"{r['load']:.2f}"]
        for r in rows]))
    less_first = [r["train_s"] - r["first_step_s"] for r in rows if "first_step_s" in r]  # compilation apart
    for key, values in (("train_s", [r["train_s"] for r in rows]), ("train_s less the first step", less_first),
                        ("test_acc", [r["test_acc"] for r in rows])):
        if values:
            print(f"{key}: median {statistics.median(values):.4g}, range {min(values):.4g}-{max(values):.4g}")


def print_against_plain(recipe: str, rows, plain_rows) -> bool:
    """Each seed's training time against the plain loop's, run just before it; True when every run is within it."""
    print(f"\n{recipe} against the plain loop, seed by seed (1-minute load average at each run's start)\n")
    ratios = [r["train_s"] / p["train_s"] for r, p in zip(rows, plain_rows)]
    print(markdown_table(
        ["seed", "plain loop s", "load", "plain test acc", "recipe s", "load", "recipe test acc", "recipe / plain"],
        [[str(r["seed"]), f"{p['train_s']:.1f}", f"{p['load']:.2f}", fraction(p["test_acc"]), f"{r['train_s']:.1f}",
          f"{r['load']:.2f}", fraction(r["test_acc"]), f"{ratio:.2f}"]
         for r, p, ratio in zip(rows, plain_rows, ratios)]))
    within = all(ratio <= 1.0 for ratio in ratios)
    print(f"recipe test acc: median {statistics.median(r['test_acc'] for r in rows):.4f}; recipe / plain: median "
          f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}; every run within the plain loop's time: "
          f"{'yes' if within else 'no'}")
    return within


def run_series(recipes, runs: int, extra, run=None, first_seed: int = 42) -> dict:
    """Seeds ``first_seed``, +1, ... of every recipe, the recipes alternating within each seed (A 42, B 42, A 43, ...):
    a slow spell of the machine falls on both sides of a comparison, not on one."""
    run = run or one_run
    rows = {recipe: [] for recipe in recipes}
    for i in range(runs):
        for recipe in recipes:
            r = run(recipe, first_seed + i, extra)
            rows[recipe].append(r)
            print(f"{Path(recipe).name} seed {r['seed']}: {r['epochs']} epochs, training {r['train_s']:.2f} s (first "
                  f"step {r.get('first_step_s', float('nan')):.2f} s), "
                  f"{r['images_per_sec']:.0f} img/s, val acc {fraction(r['val_acc'])}, test acc "
                  f"{fraction(r['test_acc'])}, wall {r['wall_s']:.0f} s, load {r.get('load', float('nan')):.2f}",
                  flush=True)
    return rows


def time_ratio(rows, baseline_rows) -> float:
    """Median training seconds of a recipe over the baseline's, both from the same series."""
    return statistics.median(r["train_s"] for r in rows) / statistics.median(r["train_s"] for r in baseline_rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=42, help="seeds FIRST, FIRST+1, ... (a series continued)")
    comparison = parser.add_mutually_exclusive_group()
    comparison.add_argument("--against", metavar="BASELINE_RECIPE",
                            help="also run this recipe, alternating with RECIPE seed by seed, and print the ratio of "
                                 "their median training times")
    comparison.add_argument("--against-plain", action="store_true",
                            help="also run benchmarks/plain_loop.py, alternating with RECIPE seed by seed (plain "
                                 "first), and print each run's training time against the plain loop's")
    opts, extra = parser.parse_known_args(argv)
    # Everything after the recipe that is not --runs goes to train.py: flags for every run (after --).
    opts.extra = [flag for flag in extra if flag != "--"]
    baseline = PLAIN if opts.against_plain else opts.against
    recipes = [baseline, opts.recipe] if baseline else [opts.recipe]
    rows = run_series(recipes, opts.runs, opts.extra, run=run_with_plain, first_seed=opts.first_seed)
    for recipe in recipes:
        print_table(recipe, [] if recipe == PLAIN else opts.extra, rows[recipe])
    if opts.against:
        ratio = time_ratio(rows[opts.recipe], rows[opts.against])
        print(f"\ntraining time of {opts.recipe} / {opts.against}: {ratio:.2f} (medians, runs alternating)")
    if opts.against_plain:
        print_against_plain(opts.recipe, rows[opts.recipe], rows[PLAIN])


if __name__ == "__main__":
    main()
