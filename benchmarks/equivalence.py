"""The equivalence figures in docs/strategies.md, from the same runs the tests make (tiny IDX data, mlp).

    .venv/bin/python -m benchmarks.equivalence

Prints how far apart the final weights of runs that theory says are equal (or close) end up.
"""

import tempfile
from pathlib import Path

from benchmarks.tables import markdown_table
from tests.idx_files import write_fashion_mnist
from tests.strategy_runs import StrategyRuns
from tests.test_equivalence import DDP2, MOMENTUM, _plain_sgd


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="equivalence-"))
    runs = StrategyRuns(write_fashion_mnist(base / "data"), base)
    one = runs.get("--devices", "1", "--batch_size", "32", *MOMENTUM)
    ddp = runs.get(*DDP2, "--batch_size", "16", *MOMENTUM)
    fsdp = runs.get("--strategy", "fsdp", "--devices", "2", "--batch_size", "16", *MOMENTUM)
    print("8 steps, mlp, SGD momentum 0.9, weight decay 5e-4, lr 0.05, effective batch 32\n")
    print(markdown_table(["compared", "max abs weight difference", "weights moved by"], [
        ["2 ranks x 16 (ddp) vs 1 process x 32", f"{ddp.distance(one):.1e}", f"{one.moved():.3f}"],
        ["2 ranks x 16 fsdp vs ddp", f"{fsdp.distance(ddp):.1e}", f"{ddp.moved():.3f}"]]))
    print("\nplain SGD: 2 ranks x 16 at 2*lr (linear rule), 8 steps, vs 1 process x 16 at lr\n")
    rows = []
    for lr in (0.04, 0.02, 0.01):
        scaled = runs.get(*DDP2, *_plain_sgd(lr), "--lr_scaling", "linear")
        same_images = runs.get("--devices", "1", *_plain_sgd(lr), "--lr_scaling", "none")
        same_steps = runs.get("--devices", "1", *_plain_sgd(lr), "--lr_scaling", "none", "--trainer.max_steps", "8")
        gap = scaled.distance(same_images)
        rows.append([str(lr), f"{gap:.2e}", f"{scaled.distance(same_steps):.2e}", f"{scaled.moved():.2e}",
                     f"{gap / scaled.moved():.4f}"])
    print(markdown_table(["lr", "vs 16 steps at lr (same images)", "vs 8 steps at lr", "weights moved by",
                          "16-step gap / moved"], rows))


if __name__ == "__main__":
    main()
