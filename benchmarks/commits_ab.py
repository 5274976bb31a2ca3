"""Does a change cost speed? train.py at an earlier commit against the working tree, alternating, in one run.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.commits_ab 084bfa8 --runs 5 \
        -- --data.train_subset 20000 --epochs 3 --trainer.limit_val_batches 5

The earlier commit runs from a temporary worktree, each run in a scratch folder with one OpenMP thread, the trees
alternating (old, new, new, old, ...); a run's speed is the median ``throughput/images_per_sec`` of epochs 2..n from
its TensorBoard file (the one record every commit since the throughput callback writes). Prints the ratio new/old.
"""

import argparse
import functools
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks.speed import interleaved, machine
from benchmarks import launch
from benchmarks.launch import REPO
from benchmarks.tables import markdown_table, median_range

TAG = "throughput/images_per_sec"


def steady_speed(folder: Path) -> float:
    """Median images/sec of epochs 2..n of the one run under ``folder``."""
    events = sorted(folder.rglob("events.out.tfevents.*"))
    if not events:
        raise RuntimeError(f"no TensorBoard file under {folder}")
    accumulator = EventAccumulator(str(events[-1].parent), size_guidance={"scalars": 0})
    accumulator.Reload()
    values = [event.value for event in accumulator.Scalars(TAG)]
    if len(values) < 2:
        raise RuntimeError(f"{TAG} has {len(values)} epoch(s) in {folder}: give --epochs 2 or more")
    return statistics.median(values[1:])


def one_run(tree: Path, flags: Sequence[str], timeout_s: float) -> float:
    # steady_speed looks through the whole scratch folder, wherever the commit's config put its TensorBoard files
    return launch.train_record(flags, timeout_s, 1, lambda runs: steady_speed(runs.parent), tree / "train.py")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s COMMIT [--runs N] [--timeout S] [-- TRAIN_PY_FLAGS]")
    parser.add_argument("commit", help="the earlier commit (anything git rev-parse takes)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each tree")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    argv = sys.argv[1:] if argv is None else list(argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.commit], capture_output=True,
                            text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="commits-ab-tree-") as parent:
        old_tree = Path(parent) / commit
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old_tree), commit],
                       check=True, capture_output=True)
        try:
            speeds = interleaved({side: functools.partial(one_run, tree, flags, args.timeout)
                                  for side, tree in (("old", old_tree), ("new", REPO))}, args.runs,
                                 lambda i, got, wall: print(f"run {i + 1}/{args.runs}: old {got['old'][-1]:.0f}, new "
                                                            f"{got['new'][-1]:.0f} images/sec", flush=True))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)],
                           capture_output=True)
    ratios = [new / old for new, old in zip(speeds["new"], speeds["old"])]
    print(f"\ntrain.py {' '.join(flags)}; {machine()}")
    print(markdown_table(["tree", f"images/sec, median (range) of {args.runs}"],
                         [[commit, median_range(speeds["old"])], ["working tree", median_range(speeds["new"])]]))
    print(f"new/old: {statistics.median(speeds['new']) / statistics.median(speeds['old']):.3f} "
          f"(per pair {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
