"""Time to accuracy of a recipe: run it N times (seeds 42, 43, ...) and quote the median and the spread.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.recipe_runs configs/recipes/fast_cpu.yaml [--runs 3]

Each run is ``train.py --config RECIPE --seed S`` as a user types it, in a scratch folder.
Training seconds are the last epoch line's Cumulative Time (training only, validation
excluded); test accuracy is the test after fit (the best checkpoint by val/acc, which
for a one-cycle recipe is the last epoch). Extra flags after ``--`` go to every run.
"""

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.speed import machine  # noqa: E402
from callbacks.throughput import parse_epoch_lines  # noqa: E402
from cli import launch  # noqa: E402

TEST_ACC = re.compile(r"test/acc\s*[│|]?\s*([\d.]+)")


def one_run(recipe: str, seed: int, extra) -> dict:
    started = time.perf_counter()
    try:
        finished = launch.run_in_scratch(["--config", str(Path(recipe).resolve()), "--seed", str(seed), *extra], 3600)
    except RuntimeError as error:
        raise SystemExit(f"seed {seed}: {error}") from error
    wall = time.perf_counter() - started
    epochs = parse_epoch_lines(finished.stdout)
    test = TEST_ACC.search(finished.stdout + finished.stderr)
    return {"seed": seed, "epochs": len(epochs), "train_s": epochs[-1].cumulative_s,
            "images_per_sec": statistics.median(e.images_per_sec for e in epochs), "val_acc": epochs[-1].val_acc,
            "test_acc": float(test.group(1)) if test else float("nan"), "wall_s": wall}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--runs", type=int, default=3)
    opts, extra = parser.parse_known_args(argv)
    # Everything after the recipe that is not --runs goes to train.py: flags for every run (after --).
    opts.extra = [flag for flag in extra if flag != "--"]
    rows = []
    for i in range(opts.runs):
        rows.append(one_run(opts.recipe, 42 + i, opts.extra))
        r = rows[-1]
        print(f"seed {r['seed']}: {r['epochs']} epochs, training {r['train_s']:.1f} s, {r['images_per_sec']:.0f} img/s, "
              f"val acc {r['val_acc']:.4f}, test acc {r['test_acc']:.4f}, wall {r['wall_s']:.0f} s", flush=True)
    print(f"\n{opts.recipe} {' '.join(opts.extra)}; {machine()}\n")
    print("| seed | epochs | training s | images/sec | test acc | wall s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['epochs']} | {r['train_s']:.1f} | {r['images_per_sec']:.0f} | {r['test_acc']:.4f} | "
              f"{r['wall_s']:.0f} |")
    for key in ("train_s", "test_acc"):
        values = [r[key] for r in rows]
        print(f"{key}: median {statistics.median(values):.4g}, range {min(values):.4g}-{max(values):.4g}")


if __name__ == "__main__":
    main()
