"""Run train.py as a user would and read back what it recorded: the harness of experiments 2 and 3 (one train.py, or
torchrun "nodes" on 127.0.0.1, per run; its records, never its output). docs/large_batch.md, "How experiments 2 and 3
run".
"""

import json
import math
import os
import shutil
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from callbacks.run_record import read_epochs, run_dirs
from benchmarks import launch
from benchmarks.tables import figure, markdown_table, median_range, write_csv
from fashion_mnist_dp.cli.checks import CPU_RANKS_PER_CORE
from fashion_mnist_dp.cli.outputs import short_name
from fashion_mnist_dp.exit_codes import ExitCode

TRAIN_PY = launch.TRAIN_PY
RECIPES = launch.REPO / "configs" / "recipes"
DIVERGED_EXIT = int(ExitCode.DIVERGED)
RESULT_FILE = "result.json"  # exit code and wall time, written when the run has ended


@dataclass
class RunSpec:
    """One training run: a label, an optional recipe from configs/recipes, the process count and extra flags."""

    name: str  # folder name and table label
    recipe: Optional[str] = None  # e.g. "sgd" -> --config configs/recipes/sgd.yaml
    devices: int = 1  # ranks in all (world size)
    flags: List[str] = field(default_factory=list)  # train.py flags after the recipe (later wins)
    virtual: int = 1  # devices one process stands for (--virtual_devices): a single process however many
    seed: Optional[int] = None  # None: the budget's
    cell: Optional[str] = None  # the table row this run is one seed of; None: a row of its own (its name)

    @property
    def row(self) -> str:
        return self.cell or self.name


@dataclass
class Budget:
    """What every run of an experiment gets: the same network, epochs and training images."""

    epochs: int = 4
    train_subset: Optional[int] = None  # the first N training images; None: all 60,000
    network: str = "cnn"
    data_dir: Optional[str] = None  # None: $FASHION_MNIST_DIR, as train.py
    target: float = 0.85  # val acc for the time-to-target columns
    timeout_s: float = 900.0  # per run
    threads: int = 1  # OMP_NUM_THREADS of every rank: one process stands for one device (one core)
    seed: int = 42  # --seed of every run (configs/default.yaml's)
    val_size: int = 0  # training images held out for validation; 0: validation on the test split
    parallel: int = 1  # runs at once (each of them one process: virtual devices)
    resume: bool = False  # keep the runs that finished before in out_dir (their result.json), train the others

    def flags(self, seed: Optional[int] = None) -> List[str]:
        seed = self.seed if seed is None else seed  # --seeds 0 is seed 0
        flags = ["--network", self.network, "--epochs", str(self.epochs), "--seed", str(seed),
                 "--test_after_fit", "false", "--data.val_size", str(self.val_size)]
        if self.train_subset:
            flags += ["--data.train_subset", str(self.train_subset)]
        if self.data_dir:
            flags += ["--data_dir", str(Path(self.data_dir).resolve())]
        return flags


@dataclass
class RunResult:
    spec: RunSpec
    returncode: int
    wall_s: float  # the whole command, start-up and validation included
    rows: List[dict]  # the record's epochs: epoch, cumulative_s, val_acc, val_loss (floats, None when not measured)
    summary: dict  # hparams.yaml, flat: effective_batch_size, scaled_lr, warmup_steps, optimizer, momentum...
    images_per_sec: List[float]  # the record's epochs
    stderr_tail: str = ""

    @property
    def accuracies(self) -> List[float]:
        return [r["val_acc"] for r in self.rows if r["val_acc"] is not None]

    @property
    def best_acc(self) -> Optional[float]:
        return max(finite(self.accuracies), default=None)

    @property
    def final_acc(self) -> Optional[float]:
        return self.accuracies[-1] if self.accuracies else None

    @property
    def non_finite(self) -> bool:
        values = [r[k] for r in self.rows for k in ("val_acc", "val_loss") if r[k] is not None]
        return any(not math.isfinite(v) for v in values)

    def to_target(self, target: float) -> Optional[dict]:
        """The first timed epoch row with val acc >= target, else None."""
        return next((r for r in self.rows if r["val_acc"] is not None and r["val_acc"] >= target
                     and r["cumulative_s"] is not None), None)

    @property
    def median_images_per_sec(self) -> Optional[float]:
        return statistics.median(self.images_per_sec) if self.images_per_sec else None


def verdict(result: RunResult, best_of_table: Optional[float], margin: float = 0.02) -> str:
    """docs/large_batch.md's verdict rules (diverged, failed, degraded, converged)."""
    if result.returncode == DIVERGED_EXIT or result.non_finite:
        return "diverged"
    if result.returncode != 0:
        return f"failed (exit {result.returncode})"
    if result.best_acc is None or (best_of_table is not None and result.best_acc < best_of_table - margin):
        return "degraded"
    return "converged"


def verdicts(results: Sequence[RunResult], margin: float = 0.02) -> List[str]:
    """Each run's verdict against the best finished run of ``results``."""
    finished = [r.best_acc for r in results if r.returncode == 0 and r.best_acc is not None]
    best = max(finished) if finished else None
    return [verdict(r, best, margin) for r in results]


def nodes_for(devices: int, max_ranks_per_node: int) -> int:
    """The fewest "nodes" k with devices/k whole and at most ``max_ranks_per_node``."""
    for k in range(1, devices + 1):
        if devices % k == 0 and devices // k <= max_ranks_per_node:
            return k
    return devices


def commands(spec: RunSpec, budget: Budget, max_ranks_per_node: int) -> List[List[str]]:
    """The command line(s) of one run: one train.py, or one torchrun per "node"."""
    recipe = ["--config", str(RECIPES / f"{spec.recipe}.yaml")] if spec.recipe else []
    k = nodes_for(spec.devices, max_ranks_per_node)
    per_node = spec.devices // k
    common = [*recipe, "--accelerator", "cpu", *budget.flags(spec.seed), *spec.flags]
    if spec.virtual > 1:
        return [[str(TRAIN_PY), *common, "--devices", "1", "--virtual_devices", str(spec.virtual)]]
    if k == 1:
        strategy = ["--strategy", "ddp", "--devices", str(per_node)] if per_node > 1 else ["--devices", "1"]
        return [[str(TRAIN_PY), *common, *strategy]]
    port = str(launch.free_port())
    return [["-m", "torch.distributed.run", "--nnodes", str(k), "--nproc_per_node", str(per_node),
             "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", port, str(TRAIN_PY), *common,
             "--strategy", "ddp", "--devices", str(per_node), "--num_nodes", str(k)] for node in range(k)]


def read_summary(path: Path) -> dict:
    """hparams.yaml, flat: the network's and optimizer's short names, their init_args beside the other values."""
    loaded = yaml.safe_load(path.read_text()) if path.is_file() else None  # numbers, strings, the class paths' dicts
    if not isinstance(loaded, dict):
        return {}
    summary = {key: value for key, value in loaded.items() if not isinstance(value, dict)}
    for key in ("network", "optimizer"):
        entry = loaded.get(key)
        if isinstance(entry, dict):
            summary[key] = short_name(entry.get("class_path"))
            for name, value in (entry.get("init_args") or {}).items():
                summary.setdefault(name, value)
    return summary


def run(spec: RunSpec, budget: Budget, out_dir: Path, max_ranks_per_node: Optional[int] = None,
        log=print) -> RunResult:
    """Train ``spec`` in ``out_dir/runs/<name>`` (emptied first) and read back its records."""
    folder = Path(out_dir) / "runs" / spec.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = launch.clean_env({"OMP_NUM_THREADS": str(budget.threads)}, keep_data_dir=True)
    argvs = commands(spec, budget, max_ranks_per_node or CPU_RANKS_PER_CORE * (os.cpu_count() or 1))
    (folder / "command.txt").write_text("\n".join(" ".join(["python", *argv]) for argv in argvs) + "\n")
    started = time.monotonic()
    jobs = launch.start_all([(f"node{i}", argv, folder, env) for i, argv in enumerate(argvs)], folder / "logs")
    launch.wait_all(jobs, budget.timeout_s)  # stops every job (and what it started) at the deadline
    wall = time.monotonic() - started
    codes = [job.returncode for job in jobs]
    # Node 0's code decides (exit 70 comes from rank 0's process); a timeout (killed: negative) counts as a failure.
    code = codes[0] if all(c is not None and c >= 0 for c in codes) else -1
    if code == 0 and any(codes):
        code = next(c for c in codes if c)
    # Written last: a folder with it holds a finished run, which ``load`` (--report_only) reads back.
    (folder / RESULT_FILE).write_text(json.dumps({"returncode": code, "wall_s": round(wall, 2)}) + "\n")
    result = read_result(spec, folder)
    best = "n/a" if result.best_acc is None else f"{result.best_acc:.4f}"
    log(f"  {spec.name}: exit {code}, best val acc {best}, {wall:.0f} s", flush=True)
    if code not in (0, DIVERGED_EXIT):
        log(f"--- {spec.name} stderr tail:\n{result.stderr_tail}", file=sys.stderr, flush=True)
    return result


def read_result(spec: RunSpec, folder: Path) -> RunResult:
    """A finished run's records: exit code and wall time, its epochs (metrics.csv), the start block (hparams.yaml)."""
    ended = json.loads((folder / RESULT_FILE).read_text())
    stderr = "".join(p.read_text(errors="replace") for p in sorted((folder / "logs").glob("node*.err")))
    runs = run_dirs(folder / "runs")  # every run starts in an empty folder: one run
    records = read_epochs(runs[-1]) if runs else []
    rows = [{"epoch": r.epoch, "cumulative_s": r.cumulative_s, "val_acc": r.val_acc, "val_loss": r.val_loss}
            for r in records]
    return RunResult(spec, int(ended["returncode"]), float(ended["wall_s"]), rows,
                     read_summary(runs[-1] / "hparams.yaml") if runs else {},
                     [r.images_per_sec for r in records if r.images_per_sec is not None], stderr[-3000:])


def load(specs: Sequence[RunSpec], out_dir: Path) -> List[RunResult]:
    """The results of runs trained before into ``out_dir`` (``--report_only``: redraw tables without training).

    Raises FileNotFoundError naming the first run that has not finished there.
    """
    missing = [s.name for s in specs if not (Path(out_dir) / "runs" / s.name / RESULT_FILE).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(specs)} runs have no {RESULT_FILE} in {out_dir}/runs "
                                f"(first: {missing[0]}); train them: leave out --report_only")
    return [read_result(s, Path(out_dir) / "runs" / s.name) for s in specs]


# ---------------------------------------------------------------------------------------------- reporting


def lr_cell(summary: dict) -> str:
    """``0.01 → 0.04 (linear)``; the base alone when no rule changed it."""
    if not summary:
        return "n/a"
    base, scaled, rule = summary.get("base_lr"), summary.get("scaled_lr"), summary.get("lr_scaling")
    if rule == "none" or scaled == base:
        return f"{base:g} ({rule})"
    # hparams.yaml keeps the hyperparameter base_batch_size as given (null: the per-device batch)
    base_batch = summary.get("base_batch_size") or summary.get("batch_size_per_device")
    return f"{base:g} @ {base_batch} → {scaled:.4g} ({rule})"


def warmup_cell(summary: dict) -> str:
    steps = summary.get("warmup_steps")
    if not steps:
        return "none" if summary else "n/a"
    per_epoch = summary.get("steps_per_epoch") or 1
    return f"{steps / per_epoch:.3g} ep ({steps} steps)"


def plot_curves(results: Sequence[RunResult], labels: Sequence[str], path: Path, title: str,
                target: Optional[float] = None) -> None:
    """Val acc against epoch (left) and against cumulative training seconds (right), one line per run; runs with
    the same label (a row's seeds) share a colour and one legend entry."""
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    fig, (by_epoch, by_time) = figure()
    names = list(dict.fromkeys(labels))
    palette = colormaps["tab10" if len(names) <= 10 else "tab20"]
    seen = set()
    for result, label in zip(results, labels):
        rows = [r for r in result.rows if r["val_acc"] is not None and math.isfinite(r["val_acc"])
                and r["cumulative_s"] is not None]
        if not rows:
            continue
        style = dict(marker="o", color=palette(names.index(label) % palette.N), label=None if label in seen else label)
        seen.add(label)
        by_epoch.plot([r["epoch"] for r in rows], [r["val_acc"] for r in rows], **style)
        by_time.plot([r["cumulative_s"] for r in rows], [r["val_acc"] for r in rows], **style)
    for axes, xlabel in ((by_epoch, "epoch"), (by_time, "cumulative training time (s)")):
        if target is not None:
            axes.axhline(target, linestyle="--", color="grey", linewidth=1)
        axes.set_xlabel(xlabel)
        axes.set_ylabel("validation accuracy")
        if xlabel == "epoch":
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
    by_epoch.legend(fontsize=7, loc="lower right")
    fig.suptitle(title)
    fig.savefig(path, dpi=90)


# ---------------------------------------------------------------------------------------------- command line


def add_budget_arguments(parser, out_dir: str, epochs: int, train_subset: int, target: float, each: str) -> None:
    """The options every experiment command shares (``each``: what runs once per seed); ``budget_from`` reads them."""
    parser.add_argument("--out_dir", default=out_dir, help="runs, table and plots go here")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--train_subset", type=int, default=train_subset, help="first N training images; 0: all 60,000")
    parser.add_argument("--network", default="fast_cnn", choices=["mlp", "cnn", "fast_cnn", "gpu_cnn", "wrn",
                                                                   "resnet18"])
    parser.add_argument("--target", type=float, default=target, help="val acc for the time-to-target column")
    parser.add_argument("--margin", type=float, default=0.02, help="degraded: best val acc this far below the best run")
    parser.add_argument("--data_dir", default=None, help="default: $FASHION_MNIST_DIR, as train.py")
    parser.add_argument("--timeout_s", type=float, default=Budget.timeout_s, help="per run")
    parser.add_argument("--max_ranks_per_node", type=int, default=None,
                        help="more processes than this run as torchrun 'nodes' on 127.0.0.1; default: 8 per CPU core")
    parser.add_argument("--threads", type=int, default=Budget.threads,
                        help="OMP_NUM_THREADS of every process: 1 makes one process one device (one core)")
    parser.add_argument("--report_only", action="store_true",
                        help="train nothing: redraw the table and plots from the runs already in --out_dir")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs that finished in --out_dir before (an interrupted grid), train the rest")
    parser.add_argument("--seeds", default=[42, 43, 44], type=lambda text: [int(s) for s in text.split(",")],
                        help=f"comma-separated; every {each} runs each")
    parser.add_argument("--val_size", type=int, default=5000, help="training images held out for validation")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each)")


def run_command(module: str, argv: Optional[Sequence[str]], specs: Sequence[RunSpec], budget: Budget, args,
                write_outputs: Callable) -> int:
    """An experiment command after its arguments: train ``specs`` (``--report_only``: read them back from
    ``--out_dir``, wall time None) and print what ``write_outputs(results, budget, args, command, wall_s)`` wrote.
    Exit status 0 when every run finished or was stopped as diverged (a result), else 1; 2 (after one error line)
    when a run to read back has not finished."""
    if args.report_only:
        try:
            results, wall_s = load(specs, Path(args.out_dir)), None
        except FileNotFoundError as missing:
            print(f"error: {missing}", file=sys.stderr)
            return 2
    else:
        results, wall_s = run_all(specs, budget, Path(args.out_dir), args.max_ranks_per_node)
    command = " ".join(["python -m", module, *(sys.argv[1:] if argv is None else argv)])
    print(write_outputs(results, budget, args, command, wall_s))
    return 0 if all(r.returncode in (0, DIVERGED_EXIT) for r in results) else 1


def budget_from(args) -> Budget:
    return Budget(epochs=args.epochs, train_subset=args.train_subset or None, network=args.network,
                  data_dir=args.data_dir, target=args.target, timeout_s=args.timeout_s, threads=args.threads,
                  val_size=args.val_size, parallel=args.parallel, resume=args.resume)


def run_all(specs: Sequence[RunSpec], budget: Budget, out_dir: Path, max_ranks_per_node: Optional[int] = None):
    """The runs, ``budget.parallel`` at a time (1: in turn), in ``specs``' order; returns (results, wall seconds).

    With ``budget.resume`` a run that finished before (its result.json) is read back, not trained again; the wall
    seconds are then None (the grid's time is not this call's).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    # SIGTERM (a job scheduler, kill) ends like Ctrl-C: run()'s finally then stops the run's processes.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    kept: List[str] = []

    def one(numbered):
        i, spec = numbered
        folder = Path(out_dir) / "runs" / spec.name
        if budget.resume and (folder / RESULT_FILE).is_file():
            kept.append(spec.name)
            print(f"[{i + 1}/{len(specs)}] {spec.name}: finished before, kept", flush=True)
            return read_result(spec, folder)
        what = f"{spec.virtual} virtual devices" if spec.virtual > 1 else f"{spec.devices} process(es)"
        print(f"[{i + 1}/{len(specs)}] {spec.name}: {what}", flush=True)
        return run(spec, budget, out_dir, max_ranks_per_node)

    with ThreadPoolExecutor(max_workers=max(1, budget.parallel)) as pool:
        results = list(pool.map(one, enumerate(specs)))
    return results, None if kept else time.monotonic() - started


def write_report(path: Path, command: str, budget_text: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                 results: Sequence[RunResult], wall_s: Optional[float], budget: Budget, margin: float) -> str:
    """The experiment's Markdown (command, budget, how long it took, the table, the verdict rules), written to
    ``path`` and returned."""
    grid = f"Wall time {wall_s / 60:.1f} min, " if wall_s is not None else ""
    text = "\n".join([
        f"Command: `{command}`", "",
        f"{budget_text} {grid}{sum(r.wall_s for r in results) / 60:.1f} min of runs in all ({budget.parallel} at a "
        f"time).", "", markdown_table(columns, rows), "",
        f"Verdicts (per seed): diverged = exit 70 (non-finite values, or val acc at chance an epoch after warm-up) "
        f"or a non-finite val loss/acc; degraded = best val acc more than {margin:g} below the best run of the "
        f"table; converged = within {margin:g} of it. A row whose seeds disagree counts them.", ""])
    path.write_text(text)
    return text


def finite(values: Sequence[Optional[float]]) -> List[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def seed_stats(values: Sequence[Optional[float]]) -> List[Optional[float]]:
    """[median, min, max] of the finite values (a diverged seed has none); [None] * 3 when no seed has one."""
    kept = finite(values)
    return [statistics.median(kept), min(kept), max(kept)] if kept else [None, None, None]


def spread(values: Sequence[Optional[float]]) -> str:
    """Median and range over seeds, e.g. ``0.842 (0.838–0.846)``; ``+ n/a`` when a seed has no finite value,
    ``n/a`` alone when none has; a single seed is its value."""
    kept = finite(values)
    if not kept or len(values) == 1:
        return f"{kept[0]:.3f}" if kept else "n/a"
    return median_range(kept, ".3f", "–", " + n/a" if len(kept) < len(values) else "")


def by_row(results: Sequence[RunResult], margin: float) -> List[Tuple[List[RunResult], List[str]]]:
    """The runs grouped into table rows (``RunSpec.row``, first-seen order), each with its seeds' verdicts (against
    the best run of the whole table)."""
    verdict_of = dict(zip((id(r) for r in results), verdicts(results, margin)))
    rows: Dict[Tuple[int, str], List[RunResult]] = {}
    for result in results:
        rows.setdefault((result.spec.virtual, result.spec.row), []).append(result)
    return [(runs, [verdict_of[id(r)] for r in runs]) for runs in rows.values()]


def verdict_cell(seen: Sequence[str]) -> str:
    """The seeds' verdicts: ``converged``, or ``diverged 2/3`` when they do not agree."""
    counts = {v: seen.count(v) for v in dict.fromkeys(seen)}
    if len(counts) == 1:
        return seen[0]
    return ", ".join(f"{v} {c}/{len(seen)}" for v, c in sorted(counts.items(), key=lambda vc: -vc[1]))


def write_runs_csv(path: Path, results: Sequence[RunResult], labels: Dict[str, Callable[[RunResult], object]],
                   verdicts_: Optional[Sequence[str]] = None) -> None:
    """One line per run: its name, its ``labels`` columns (table row, devices...), seed, exit code, its verdict
    when given, then what it recorded."""
    verdict = ["verdict"] if verdicts_ else []
    write_csv(path, ["run", *labels, "seed", "exit_code", *verdict, "final_val_acc", "best_val_acc", "images_per_sec",
                     "wall_s"],
              [[r.spec.name, *(label(r) for label in labels.values()), r.spec.seed, r.returncode,
                *([verdicts_[i]] if verdicts_ else []), r.final_acc, r.best_acc, r.median_images_per_sec,
                round(r.wall_s, 1)] for i, r in enumerate(results)])
