"""Every command in a ``bash`` block of README.md and docs/tutorial.md runs, as a user types it from the repository,
with a few batches: none of them can rot unseen.

What is appended or changed, and nothing else (as tests/cluster/recipes.py does for the cluster recipes):

- train.py (also ``make train``, whose recipe is checked to be ``python train.py $(ARGS)``, and each torchrun
  "node"): ``--trainer.limit_train_batches 2 --trainer.limit_val_batches 1 --trainer.limit_test_batches 1 --epochs 1
  --test_after_fit false --batch_size 16`` (16 images per device, also for 40 virtual ones), data written here
  (:func:`data`, large enough for every documented batch, held-out split and subset) and its own output folder;
- GPUs a command asks for that this machine lacks: ``--accelerator cpu``, as many CPU ranks, at most 2 (this
  machine's cores); the GPU network ``wrn`` becomes ``--network cnn``, as its recipes advise on a CPU; ``--strategy
  dp`` has no CPU form and must end in its one line, exit 2 (fsdp on a CPU too, below torch 2.7);
- torchrun: one process per "node", the address 127.0.0.1 and a free port, every ``--node_rank`` of ``--nnodes``
  started side by side;
- ``python -m`` tools: :data:`MODULES`' flags that shrink them to one small run (a tool with no entry fails the test).

Each distinct command runs once (:func:`key`). The one-process commands run in this process, meanwhile the others
in processes of their own, side by side; each must end with its documented exit code and no traceback, and a
train.py that trained must have printed its epoch line. ``make test`` is this suite and is not run here.
"""

import re
import runpy
import shlex
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch
import yaml

from benchmarks import launch
from benchmarks.launch import REPO
from tests.idx_files import write_idx

pytestmark = pytest.mark.multiprocess

DOCS = ("README.md", "docs/tutorial.md")
FEW_BATCHES = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
               "--trainer.limit_test_batches", "1", "--epochs", "1", "--test_after_fit", "false", "--batch_size", "16"]
CPU_RANKS = 2
AT_ONCE = 2  # commands in processes of their own at a time: a rank holds about 1 GB, a core is busy
TIMEOUT_S = 300  # each
GPUS = torch.cuda.device_count()
FSDP_ON_CPU = hasattr(torch.cpu.Stream, "record_event")  # torch >= 2.7 (tests/conftest.py)
N_TRAIN, N_TEST = 21_504, 101  # the documented --data.train_subset 16384 beside --data.val_size 5000


def modules(data: Path, out: Path) -> Dict[str, Tuple[List[str], bool]]:
    """``python -m`` tools: (flags appended, whether it runs in this process). A tool that trains gets one small run."""
    small = ["--seeds", "42", "--epochs", "1", "--train_subset", "1024", "--val_size", "256", "--data_dir", str(data),
             "--out_dir", str(out)]
    return {
        "experiments.sandbox": (["--world_size", "2", "--n_experiments", "100"], False),
        "experiments.devices": (["--devices", "4", "--rules", "none", "--parallel", "1", *small], False),
        "experiments.takeaways": (["--only", "sgd", *small], False),
        "experiments.scaling": ([], True),  # --workshop only: on paper (a measurement takes minutes)
        "benchmarks.flops": ([], True),  # --rate only: arithmetic
    }


MODULES_ON_PAPER = {"experiments.scaling": "--workshop", "benchmarks.flops": "--rate"}


@dataclass
class Command:
    source: str  # the document's line, as written
    argv: List[str]  # after python: train.py ..., -m MODULE ..., or torchrun's -m torch.distributed.run ...
    env: Dict[str, str] = field(default_factory=dict)
    in_process: bool = False
    nodes: int = 1  # torchrun: one argv per node, --node_rank substituted
    expect: int = 0
    expect_line: str = ""  # a line of the documented refusal
    trains: bool = False  # a train.py run expected to print its epoch line


def documented_lines(doc: str) -> List[str]:
    """The command lines of a document's ``bash`` blocks, continuations joined, comments and blanks left out."""
    text = (REPO / doc).read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert blocks, f"{doc}: no bash block"
    lines = []
    for block in blocks:
        found = [line.strip() for line in block.replace("\\\n", " ").splitlines()
                 if line.strip() and not line.strip().startswith("#")]
        assert found, f"{doc}: a bash block without a command:\n{block}"
        lines += found
    return lines


def pairs(args: List[str]) -> List[Tuple[str, Optional[str]]]:
    """``--flag value`` pairs in order (a flag followed by another flag, or last: no value)."""
    out, i = [], 0
    while i < len(args):
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        out.append((args[i], value))
        i += 2 if value is not None else 1
    return out


def value(args: List[str], flag: str) -> Optional[str]:
    found = [v for f, v in pairs(args) if f == flag]
    return found[-1] if found else None


SETTINGS = {  # what a command's launch depends on: its flags (shorthand and full key) and its config files' keys
    "devices": (("--devices", "--trainer.devices"), ("trainer", "devices")),
    "strategy": (("--strategy", "--trainer.strategy"), ("trainer", "strategy")),
    "accelerator": (("--accelerator", "--trainer.accelerator"), ("trainer", "accelerator")),
    "network": (("--network", "--model.network"), ("model", "network")),
}
WRN = ("wrn", "lightning_modules.networks.WideResNet")


def settings(args: List[str]) -> Dict[str, str]:
    """:data:`SETTINGS` as the run gets them: configs/default.yaml, then its config files and flags in order."""
    found = {"devices": "1", "strategy": "auto", "accelerator": "auto", "network": "cnn"}
    for flag, given in pairs(args):
        if flag == "--config" and given:
            loaded = yaml.safe_load((REPO / given).read_text()) or {}
            for name, (_, (section, entry)) in SETTINGS.items():
                setting = (loaded.get(section) or {}).get(entry)
                if isinstance(setting, dict):
                    setting = setting.get("class_path")
                if setting is not None:
                    found[name] = str(setting)
        for name, (flags, _) in SETTINGS.items():
            if flag in flags and given is not None:
                found[name] = given
    return found


def on_this_machine(args: List[str]) -> Tuple[List[str], int, str]:
    """A train.py command's flags for this machine (module docstring), its exit code and the refusal's line."""
    args, run = list(args), settings(args)
    if run["strategy"] == "dp":
        return args, (0 if GPUS >= 2 else 2), ("strategy dp needs CUDA GPUs" if GPUS == 0 else "")
    wanted = int(run["devices"]) if run["devices"].isdigit() else CPU_RANKS  # auto: every GPU, here CPU ranks
    if run["accelerator"] != "cpu" and wanted > max(GPUS, 1):
        args += ["--accelerator", "cpu"]
    if settings(args)["accelerator"] == "cpu" or GPUS == 0:
        if wanted > CPU_RANKS or not run["devices"].isdigit():
            args += ["--devices", str(CPU_RANKS)]
        if run["network"] in WRN:
            args += ["--network", "cnn"]
        if run["strategy"] == "fsdp" and not FSDP_ON_CPU:
            return args, 2, "fsdp"
    return args, 0, ""


def one_process(args: List[str]) -> bool:
    """Whether the run is one process (no launcher starting ranks): it may run in this process."""
    run = settings(args)
    return run["devices"] == "1" or run["strategy"] == "dp"


def replaced(args: List[str], flag: str, new: str) -> List[str]:
    """``args`` with every value of ``flag`` replaced by ``new``."""
    return [new if i and args[i - 1] == flag else a for i, a in enumerate(args)]


def parse(line: str, data: Path, out: Path, tools: Dict[str, Tuple[List[str], bool]]) -> Optional[Command]:
    """The line as one :class:`Command` for this machine; None for ``make test`` (this suite)."""
    words = shlex.split(line, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, text = words.pop(0).partition("=")
        env[name] = text
    env.pop("FASHION_MNIST_DIR", None)  # the data written here instead
    if words[:2] == ["make", "test"]:
        return None
    if words[:2] == ["make", "train"]:
        recipe = re.search(r"^train:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.M)
        assert recipe and recipe.group(1) == "$(BIN)/python train.py $(ARGS)", f"make train runs: {recipe}"
        extra = [w.split("=", 1)[1] for w in words[2:] if w.startswith("ARGS=")]
        words = ["python", "train.py", *(shlex.split(extra[0]) if extra else [])]
    root = ["--data_dir", str(data), "--trainer.default_root_dir", str(out / "runs")]
    if words[:2] == ["python", "train.py"]:
        args, expect, expect_line = on_this_machine(words[2:])
        return Command(line, ["train.py", *args, *FEW_BATCHES, *root], env, in_process=one_process(args),
                       expect=expect, expect_line=expect_line, trains=expect == 0)
    if words[0] == "torchrun":
        args = words[1:]
        at = args.index("train.py")
        agent, train = args[:at], args[at + 1:]
        nodes = int(value(agent, "--nnodes") or 1)
        for flag, new in (("--nproc_per_node", "1"), ("--nproc-per-node", "1"), ("--master_addr", "127.0.0.1"),
                          ("--master_port", str(launch.free_port()))):
            agent = replaced(agent, flag, new)
        train = replaced(train, "--devices", "1")
        if GPUS == 0 and value(train, "--accelerator") != "cpu":
            train += ["--accelerator", "cpu"]
        return Command(line, ["-m", "torch.distributed.run", *agent, str(REPO / "train.py"), *train, *FEW_BATCHES,
                              *root], env, nodes=nodes, trains=True)
    if words[:2] == ["python", "-m"]:
        module = words[2]
        assert module in tools, f"{line}: no way to run python -m {module} in {__name__}.modules: add one"
        needs = MODULES_ON_PAPER.get(module)
        assert needs is None or needs in words, f"{line}: only the {needs} form of {module} runs here"
        flags, in_process = tools[module]
        return Command(line, ["-m", module, *words[3:], *flags], env, in_process=in_process)
    raise AssertionError(f"no rule for running this documented line in {__name__}: {line}")


OWN_FOLDERS = ("--trainer.default_root_dir", "--out_dir", "--master_port")  # each command's own, not what it runs


def key(command: Command) -> tuple:
    """Commands that run the same: the same program, its config files in order, its other flags (the last of each)."""
    args = command.argv
    configs = tuple(v for f, v in pairs(args) if f == "--config")
    rest = frozenset((f, v) for f, v in dict(pairs(args)).items() if f not in ("--config", *OWN_FOLDERS))
    head = tuple(args[:2]) if args[0] == "-m" else (args[0], *[a for a in args[1:2] if not a.startswith("--")])
    return (head, configs, rest, command.nodes)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Fashion-MNIST's four IDX files with :data:`N_TRAIN` training images (random pixels, ten classes)."""
    root = tmp_path_factory.mktemp("documented-data")
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    return root


def run_here(command: Command, monkeypatch) -> Tuple[int, str]:
    """A one-process command in this process, from the repository: its exit code and a traceback if it raised."""
    monkeypatch.chdir(REPO)
    if command.argv[0] == "train.py":
        from fashion_mnist_dp.cli.app import main
        try:
            return main(command.argv[1:]), ""
        except BaseException:  # noqa: B036 (a SystemExit is a result, any other exception a failure)
            return -1, traceback.format_exc()
    module = command.argv[1]
    with monkeypatch.context() as patched:
        patched.setattr(sys, "argv", [module, *command.argv[2:]])
        try:
            runpy.run_module(module, run_name="__main__")
        except SystemExit as stopped:
            return (stopped.code if isinstance(stopped.code, int) else (0 if stopped.code is None else 1)), ""
        except BaseException:  # noqa: B036
            return -1, traceback.format_exc()
    return 0, ""


def node_argv(command: Command, node: int) -> List[str]:
    """A torchrun command as "node" ``node`` starts it: its own --node_rank and output folder."""
    if command.nodes == 1:
        return command.argv
    argv = replaced(command.argv, "--node_rank", str(node))
    return replaced(argv, "--trainer.default_root_dir", f"{value(argv, '--trainer.default_root_dir')}-node{node}")


def test_every_command_of_the_readme_and_the_tutorial_runs(data, tmp_path, monkeypatch, capfd):
    tools = modules(data, tmp_path / "tools")
    commands: Dict[tuple, Command] = {}
    for doc in DOCS:
        for line in documented_lines(doc):
            command = parse(line, data, tmp_path / f"run{len(commands)}", tools)
            if command is not None:
                commands.setdefault(key(command), command)
    assert len(commands) >= 15, [c.source for c in commands.values()]  # the documents' blocks were all read
    elsewhere = [c for c in commands.values() if not c.in_process]
    failures = []
    with ThreadPoolExecutor(AT_ONCE) as pool:  # these run beside the one-process commands below, AT_ONCE at a time
        finished = [pool.submit(run_elsewhere, c, i, tmp_path / "logs") for i, c in enumerate(elsewhere)]
        capfd.readouterr()
        for command in (c for c in commands.values() if c.in_process):
            code, raised = run_here(command, monkeypatch)
            out, err = capfd.readouterr()
            failures += check(command, code, out, err + raised)
        for command, result in zip(elsewhere, finished):
            failures += result.result()
    assert not failures, "\n\n".join(failures)


def run_elsewhere(command: Command, number: int, logs: Path) -> List[str]:
    """A command in processes of its own (each torchrun "node" one), side by side, to their end: what is wrong."""
    jobs = launch.start_all([(f"command{number}-node{node}", node_argv(command, node), REPO,
                              launch.clean_env(command.env)) for node in range(command.nodes)], logs)
    timed_out = launch.wait_all(jobs, TIMEOUT_S)  # stops them all, whatever happens
    if timed_out:
        return [f"{command.source}\n  ran as: {' '.join(command.argv)}\n  {timed_out}"]
    return check(command, jobs[0].returncode, jobs[0].stdout, "".join(job.stdout + job.stderr for job in jobs),
                 codes=[job.returncode for job in jobs])


def check(command: Command, code: int, out: str, err: str, codes: Optional[List[int]] = None) -> List[str]:
    """Why the command's run is not what its document promises (empty: it is)."""
    why = []
    if any(c != command.expect for c in (codes or [code])):
        why.append(f"exit {codes or code}, documented {command.expect}")
    if "Traceback" in out + err:
        why.append("a traceback")
    if command.expect_line and command.expect_line not in err:
        why.append(f"no line with {command.expect_line!r}")
    if command.trains and not re.search(r"^Epoch 1: Cumulative Time = ", out, re.M):
        why.append("no epoch line")
    if not why:
        return []
    return [f"{command.source}\n  ran as: {' '.join(command.argv)}\n  {'; '.join(why)}\n{err[-2500:]}"]
