"""The CPU record's ablation: the recipe, then each of its choices removed in turn, on images held out of the
training set (the test split is never read), seeds 42, 43, ... with the variants alternating within each seed.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.ablation [RECIPE] [--runs 3] [--first-seed 42]
        [--only VARIANT ...]

RECIPE: configs/recipes/record_cpu.yaml unless given.

Prints one markdown table: held-out accuracy after the last epoch and training seconds (the epoch line's cumulative
time), median (range) over the seeds, and each variant's median against the recipe's.
"""

import argparse
import statistics

from benchmarks.recipe_runs import one_run, run_series
from benchmarks.speed import machine
from benchmarks.tables import markdown_table, median_range

HELD_OUT = ["--data.val_size", "5000", "--test_after_fit", "false"]
# Each choice of record_cpu.yaml and the flags that take it out (fast_cpu.yaml's network; Lightning's and torch's
# defaults for the rest).
WITHOUT = {
    "the recipe": [],
    "fast_cnn instead of staged_cnn": ["--model.network", "lightning_modules.networks.FastCNN"],
    "6 epochs instead of 8": ["--trainer.max_epochs", "6"],  # the 10-epoch table's row was 8 instead of 10
    "no warm-up": ["--model.lr_policy.warmup_epochs", "0"],
    "no label smoothing": ["--model.label_smoothing", "0"],
    "no flips in training": ["--data.horizontal_flip", "false"],
    "no flip test-time augmentation": ["--model.flip_test_time", "false"],
    "fp32 instead of bf16 autocast": ["--trainer.precision", "32-true"],
    "NCHW instead of channels_last": ["--model.channels_last", "false"],
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="configs/recipes/record_cpu.yaml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=42, help="seeds FIRST, FIRST+1, ... (a series continued)")
    parser.add_argument("--only", nargs="*", choices=list(WITHOUT), help="these variants only (the recipe always)")
    opts = parser.parse_args(argv)
    variants = [name for name in WITHOUT if name == "the recipe" or not opts.only or name in opts.only]
    rows = run_series(variants, opts.runs, [],
                      run=lambda name, seed, extra: one_run(opts.recipe, seed, [*HELD_OUT, *WITHOUT[name]]),
                      first_seed=opts.first_seed)
    base_acc = statistics.median(r["val_acc"] for r in rows["the recipe"])
    base_s = statistics.median(r["train_s"] for r in rows["the recipe"])
    seeds = f"{opts.first_seed}-{opts.first_seed + opts.runs - 1}"
    print(f"\n{opts.recipe}, {opts.runs} seeds each ({seeds}), 5,000 training images held out; {machine()}\n")
    print(markdown_table(
        ["variant", "held-out accuracy", "Δ accuracy (points)", "training s", "× the recipe's time"],
        [[name, median_range([100 * r["val_acc"] for r in rs], ".2f"),
          f"{100 * (statistics.median(r['val_acc'] for r in rs) - base_acc):+.2f}",
          median_range([r["train_s"] for r in rs], ".1f"),
          f"{statistics.median(r['train_s'] for r in rs) / base_s:.2f}"] for name, rs in rows.items()]))


if __name__ == "__main__":
    main()
