"""A default part's trial (ProcessSettings' gc_freeze or heap_reuse, or any owner's key): one run with
configs/default.yaml as it is and one with that key of that callback false, in pairs (the order alternating); per
run, the training time (the last epoch line's cumulative time) and the last step-time line (slowest rank, its lead,
the wait).

    FASHION_MNIST_DIR=../shared/data .venv/bin/python -m benchmarks.without_part \
        [--part callbacks.ProcessSettings.gc_freeze] [--pairs 5] [--threads 1] [-- train.py args]
"""

import argparse
import re
import tempfile
from pathlib import Path

import yaml

from benchmarks.launch import REPO, clean_env, run_train
from benchmarks.tables import markdown_table, median_range

EPOCH = re.compile(r"^Epoch \d+: Cumulative Time = ([\d.]+)", re.M)
STEP_TIME = re.compile(r"^Step time \(slowest rank \d+, \+(\d+) % over the median.*wait (\d+) %", re.M)


def training_time(args, folder: Path, threads: int) -> tuple:
    """(seconds, slowest rank's lead in %, wait in %) of ``train.py ARGS`` run in ``folder``, at its last epoch."""
    folder.mkdir()
    finished = run_train(args, folder, timeout_s=900, env=clean_env({"OMP_NUM_THREADS": str(threads)}, True))
    if finished.returncode != 0:
        raise SystemExit(f"train.py {' '.join(args)} failed: {finished.stderr.strip().splitlines()[-1:]}")
    lead, wait = STEP_TIME.findall(finished.stdout)[-1]
    return float(EPOCH.findall(finished.stdout)[-1]), float(lead), float(wait)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="callbacks.ProcessSettings.gc_freeze",
                        help="a default callback's class path and the key one arm sets false")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("train_args", nargs="*", help="after --: train.py's (default: the tiny fsdp run below)")
    args = parser.parse_args()
    run_args = args.train_args or ["--strategy", "fsdp", "--devices", "2", "--accelerator", "cpu", "--network", "mlp",
                                   "--epochs", "1", "--test_after_fit", "false", "--data.num_workers", "0"]
    class_path, key = args.part.rsplit(".", 1)
    callbacks = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())["trainer"]["callbacks"]
    owners = [c for c in callbacks if c["class_path"] == class_path]
    if not owners:
        raise SystemExit(f"--part {args.part}: configs/default.yaml lists no {class_path}")
    for owner in owners:
        owner.setdefault("init_args", {})[key] = False
    with tempfile.TemporaryDirectory(prefix="without-part-") as tmp:
        without = Path(tmp) / "without.yaml"
        without.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
        arms = {f"with {key} (default)": [], "without": ["--config", str(without)]}
        results = {name: [] for name in arms}
        for pair in range(args.pairs):
            for name in (list(arms) if pair % 2 == 0 else list(arms)[::-1]):
                results[name].append(training_time(run_args + arms[name], Path(tmp) / f"{pair}-{len(results[name])}"
                                                 f"-{name.split()[0]}", args.threads))
                print(name, results[name][-1], flush=True)
    print(f"train.py {' '.join(run_args)}, {args.threads} thread(s), {args.pairs} pairs: median (range)")
    print(markdown_table(["", "training time (s)", "slowest rank's lead (%)", "wait (% of the last epoch)"],
                         [[name, *(median_range([r[i] for r in rows], spec) for i, spec in
                                   enumerate((".2f", ".0f", ".0f")))] for name, rows in results.items()]))


if __name__ == "__main__":
    main()
