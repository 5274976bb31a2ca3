"""Signal -> exit delay: SIGTERM at a random moment of epoch 1 of the default recipe, the time until train.py exits.

    FASHION_MNIST_DIR=../shared/data python -m benchmarks.stop_delay [--trials 3] [-- --check_every_n_steps 10]

The worst case is the save and exit plus ``--check_every_n_steps`` optimizer steps (the ranks act on a signal at
their next decision point, fashion_mnist_dp/runtime/agreement.py); random moments land anywhere in between.
"""

import argparse
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import launch


def one_trial(extra, after_s: float) -> tuple:
    with tempfile.TemporaryDirectory() as cwd:
        env = launch.clean_env(keep_data_dir=True)
        env.pop("OMP_NUM_THREADS")
        (job,) = launch.start_all([("run", [str(launch.TRAIN_PY), *extra], Path(cwd), env)], Path(cwd) / "logs")
        time.sleep(after_s)
        sent = time.monotonic()
        job.proc.send_signal(signal.SIGTERM)
        while not job.exited():
            time.sleep(0.05)
        took = time.monotonic() - sent
        launch.stop([job])
        line = next((l for l in job.stderr.splitlines() if "stopped by" in l), "no stop line")
        return took, f"SIGTERM after {after_s:.1f} s -> exit {job.returncode} in {took:.1f} s: {line[10:70]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    opts, extra = parser.parse_known_args()
    rng = random.Random(opts.seed)
    delays = []
    for trial in range(opts.trials):
        took, line = one_trial([f for f in extra if f != '--'], 15 + rng.uniform(0, 20))
        delays.append(took)
        print(f"trial {trial}: {line}", flush=True)
    print(f"signal -> exit: median {statistics.median(delays):.1f} s, range {min(delays):.1f}-{max(delays):.1f} s "
          f"({opts.trials} trials)")


if __name__ == "__main__":
    main()
