"""Does a change cost speed? train.py at an earlier commit against the working tree, alternating, in one run.

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.commits_ab 084bfa8 --runs 5 \
        -- --data.train_subset 20000 --epochs 3 --trainer.limit_val_batches 5

Each run is ``python train.py FLAGS`` of one tree (the earlier commit checked out in a temporary worktree, or
this one) in a scratch folder, with one OpenMP thread per process as the tests use; the trees alternate run by run
(old, new, new, old, ...) so that a slow spell of the machine falls on both. A run's speed is the median of its
``throughput/images_per_sec`` over epochs 2..n (epoch 1 pays start-up), read from its TensorBoard file: the one
record every commit since the throughput callback has written, so the tool reads data, not printed output. It
prints both medians, their spreads and the ratio new/old (1.0: the change costs nothing).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks.speed import machine
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
    env = launch.clean_env(keep_data_dir=True)
    with tempfile.TemporaryDirectory(prefix="commits-ab-") as scratch:
        done = subprocess.run([sys.executable, str(tree / "train.py"), *flags], cwd=scratch, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise SystemExit(f"{tree}: train.py exited {done.returncode}:\n{done.stderr[-2000:]}")
        return steady_speed(Path(scratch))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s COMMIT [--runs N] [--timeout S] [-- TRAIN_PY_FLAGS]")
    parser.add_argument("commit", help="the earlier commit (anything git rev-parse takes)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each tree")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    argv = sys.argv[1:] if argv is None else list(argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.flags = flags
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.commit], capture_output=True,
                            text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="commits-ab-tree-") as parent:
        old_tree = Path(parent) / commit
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old_tree), commit],
                       check=True, capture_output=True)
        try:
            speeds = {"old": [], "new": []}
            for i in range(args.runs):
                for side in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    tree = old_tree if side == "old" else REPO
                    speeds[side].append(one_run(tree, args.flags, args.timeout))
                    print(f"run {i + 1}/{args.runs} {side}: {speeds[side][-1]:.0f} images/sec", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)],
                           capture_output=True)
    ratios = [new / old for new, old in zip(speeds["new"], speeds["old"])]
    print(f"\ntrain.py {' '.join(args.flags)}; {machine()}")
    print(markdown_table(["tree", f"images/sec, median (range) of {args.runs}"],
                         [[commit, median_range(speeds["old"])], ["working tree", median_range(speeds["new"])]]))
    print(f"new/old: {statistics.median(speeds['new']) / statistics.median(speeds['old']):.3f} "
          f"(per pair {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
