"""Time to accuracy of a recipe: run it N times (seeds 42, 43, ...) and quote the median and the spread.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.recipe_runs configs/recipes/fast_cpu.yaml [--runs 3]

Each run is ``train.py --config RECIPE --seed S [FLAGS after --]`` in a scratch folder, read back from its record
(training seconds: the last epoch's cumulative time; test accuracy: the test after fit). ``--against OLD.yaml`` runs
the two recipes alternately (old 42, new 42, old 43, ...) and prints the ratio of their median training times.
"""

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.speed import machine
from benchmarks import launch
from benchmarks.tables import markdown_table


def one_run(recipe: str, seed: int, extra) -> dict:
    started = time.perf_counter()
    record = launch.train_record(["--config", str(Path(recipe).resolve()), "--seed", str(seed), *extra], 3600)
    wall = time.perf_counter() - started
    epochs = [e for e in record.epochs if e.cumulative_s is not None]
    return {"seed": seed, "epochs": len(epochs), "train_s": epochs[-1].cumulative_s,
            "images_per_sec": statistics.median(e.images_per_sec for e in epochs), "val_acc": epochs[-1].val_acc,
            "test_acc": record.test.get("test/acc", float("nan")), "wall_s": wall}


def print_table(recipe: str, extra, rows) -> None:
    print(f"\n{recipe} {' '.join(extra)}; {machine()}\n")
    print(markdown_table(["seed", "epochs", "training s", "images/sec", "test acc", "wall s"], [
        [str(r["seed"]), str(r["epochs"]), f"{r['train_s']:.1f}", f"{r['images_per_sec']:.0f}", f"{r['test_acc']:.4f}",
         f"{r['wall_s']:.0f}"] for r in rows]))
    for key in ("train_s", "test_acc"):
        values = [r[key] for r in rows]
        print(f"{key}: median {statistics.median(values):.4g}, range {min(values):.4g}-{max(values):.4g}")


def run_series(recipes, runs: int, extra, run=None) -> dict:
    """Seeds 42, 43, ... of every recipe, the recipes alternating within each seed (A 42, B 42, A 43, ...): a
    slow spell of the machine falls on both sides of a comparison, not on one."""
    run = run or one_run
    rows = {recipe: [] for recipe in recipes}
    for i in range(runs):
        for recipe in recipes:
            r = run(recipe, 42 + i, extra)
            rows[recipe].append(r)
            print(f"{Path(recipe).name} seed {r['seed']}: {r['epochs']} epochs, training {r['train_s']:.1f} s, "
                  f"{r['images_per_sec']:.0f} img/s, val acc {r['val_acc']:.4f}, test acc {r['test_acc']:.4f}, "
                  f"wall {r['wall_s']:.0f} s", flush=True)
    return rows


def time_ratio(rows, baseline_rows) -> float:
    """Median training seconds of a recipe over the baseline's, both from the same series."""
    return statistics.median(r["train_s"] for r in rows) / statistics.median(r["train_s"] for r in baseline_rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--against", metavar="BASELINE_RECIPE",
                        help="also run this recipe, alternating with RECIPE seed by seed, and print the ratio of "
                             "their median training times")
    opts, extra = parser.parse_known_args(argv)
    # Everything after the recipe that is not --runs goes to train.py: flags for every run (after --).
    opts.extra = [flag for flag in extra if flag != "--"]
    recipes = [opts.against, opts.recipe] if opts.against else [opts.recipe]
    rows = run_series(recipes, opts.runs, opts.extra)
    for recipe in recipes:
        print_table(recipe, opts.extra, rows[recipe])
    if opts.against:
        ratio = time_ratio(rows[opts.recipe], rows[opts.against])
        print(f"\ntraining time of {opts.recipe} / {opts.against}: {ratio:.2f} (medians, runs alternating)")


if __name__ == "__main__":
    main()
