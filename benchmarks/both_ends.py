"""The speed ratios of `make bench` (b/a, b/c of benchmarks.speed) on two installs at once: the oldest supported
torch and Lightning against the newest, the two interpreters taking turns in one sitting.

    FASHION_MNIST_DIR=$PWD/../shared/data python -m benchmarks.both_ends --oldest .venv-oldest/bin/python \\
        --newest .venv/bin/python [--rounds 8]

benchmarks.speed run once per environment gave ratios that moved 3-14 % between two runs of the same environment
(docs/lab/speed.md), because the machine's speed drifts over minutes. Here each round runs a, b and c once under each
interpreter (a fresh process each, an untimed bare loop first; the order of the interpreters, and of a, b, c,
alternates round by round), each round's ratios come from measurements made within the same minute, and the medians
over the rounds are compared. Both interpreters run this checkout's code (cwd first on ``sys.path``); only torch,
Lightning and the other installed packages differ.
"""

import argparse
import json
import statistics
import subprocess
from typing import Dict, List

from benchmarks.launch import REPO, clean_env
from benchmarks.tables import markdown_table, median_range

# One round under one interpreter: a, b, c of benchmarks.speed once each, in the order given; JSON on the last line.
ROUND = """
import json, sys, torch, lightning
from benchmarks.speed import compute_bound, train_py_rate, workshop_loop
from datamodules.files import default_data_dir
net, batch, seconds, steps, order = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# a: the best of 5 bare loops, each with its own network and batch: one loop's speed varied from loop to loop
# (1,474-2,465 images/sec in one environment), and a bound is the best the loop does
plan = {"a": lambda: max(compute_bound(net, batch, seconds / 3) for _ in range(5)),
        "b": lambda: train_py_rate(net, batch, steps, epochs=3),
        "c": lambda: workshop_loop(net, batch, seconds, default_data_dir())}
compute_bound(net, batch, seconds)  # untimed: a process's first bare loop runs 20-40 % slower than its later ones
rates = {name: plan[name]() for name in order}
print(json.dumps({"rates": rates, "torch": torch.__version__, "lightning": lightning.__version__}))
"""


def one_round(python: str, network: str, batch: int, seconds: float, steps: int, order: str) -> dict:
    """Images/sec of a, b, c under ``python``, measured in ``order``."""
    env = clean_env(keep_data_dir=True)
    env.pop("OMP_NUM_THREADS")  # torch's own choice of threads, as make bench runs
    result = subprocess.run([python, "-c", ROUND, network, str(batch), str(seconds), str(steps), order], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{python}: one round failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def ratios(rates: Dict[str, float]) -> Dict[str, float]:
    return {"b/a": rates["b"] / rates["a"], "b/c": rates["b"] / rates["c"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.both_ends", description=__doc__.split("\n\n")[0])
    parser.add_argument("--oldest", required=True, help="the oldest leg's python (make test-oldest: .venv-oldest)")
    parser.add_argument("--newest", required=True, help="the newest leg's python (make test: .venv)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--network", default="cnn")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds of a and of c, as make bench's")
    parser.add_argument("--steps", type=int, default=15, help="train.py steps per epoch (3 epochs, 2 timed)")
    opts = parser.parse_args(argv)
    pythons = {"oldest": opts.oldest, "newest": opts.newest}
    per_round: Dict[str, List[Dict[str, float]]] = {end: [] for end in pythons}
    rates: Dict[str, Dict[str, List[float]]] = {end: {k: [] for k in "abc"} for end in pythons}
    versions: Dict[str, str] = {}
    for number in range(opts.rounds):
        ends = list(pythons) if number % 2 == 0 else list(pythons)[::-1]
        order = "abc" if number % 2 == 0 else "cba"
        for end in ends:
            done = one_round(pythons[end], opts.network, opts.batch_size, opts.seconds, opts.steps, order)
            versions[end] = f"torch {done['torch']}, Lightning {done['lightning']}"
            per_round[end].append(ratios(done["rates"]))
            for key, value in done["rates"].items():
                rates[end][key].append(value)
            print(f"round {number + 1}/{opts.rounds} {end}: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in done["rates"].items())
                  + " images/sec; " + ", ".join(f"{k} {v:.2f}" for k, v in per_round[end][-1].items()), flush=True)
    # each loop's oldest / newest round by round: a and b share the kernels, c is bound by its per-image host work
    rows = [[f"{key}, images/sec", *(median_range(rates[end][key], ".0f") for end in pythons),
             median_range([o / n for o, n in zip(rates["oldest"][key], rates["newest"][key])], ".2f")]
            for key in "abc"]
    for name in ("b/a", "b/c"):
        medians = {end: statistics.median(r[name] for r in per_round[end]) for end in pythons}
        rows.append([f"**{name}** (median of the rounds' ratios)",
                     *(median_range([r[name] for r in per_round[end]], ".2f") for end in pythons),
                     f"{medians['oldest'] / medians['newest']:.2f}"])
    print(f"\n{opts.rounds} rounds, network {opts.network}, batch {opts.batch_size}; oldest: {versions['oldest']}; "
          f"newest: {versions['newest']}")
    print(markdown_table(["", "oldest", "newest", "oldest / newest"], rows))


if __name__ == "__main__":
    main()
