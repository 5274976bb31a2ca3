"""Shared fixtures: tiny IDX data in a temporary folder, and a clean working directory per test."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from benchmarks import launch
from benchmarks.launch import REPO, TRAIN_PY  # noqa: F401 (tests import them from here)
from tests.idx_files import write_fashion_mnist

# fsdp on CPU needs torch >= 2.7 (its CPU streams): below, train.py refuses it in one line (tests/unit/test_compat.py)
FSDP_ON_CPU = pytest.mark.skipif(not hasattr(torch.cpu.Stream, "record_event"),
                                 reason="fsdp on CPU needs torch >= 2.7; this torch gets one line instead")


_suite_tmp = []  # the suite's temp folder, where this process made it


def pytest_configure(config):
    """The suite's own temp folder, TMPDIR for every process it starts (xdist's workers and theirs), removed at its
    end: what torchrun (its log folders) and a SIGKILLed process (torch's ``pymp-*``, its data workers' folder) leave
    goes with it, not into /tmp. Short (``/tmp/fm-tests-*``): a data worker's socket path under it holds 107 bytes.
    pytest's own folders stay where they were (this process's temp folder is read first)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker has its controller's
    tempfile.gettempdir()
    folder = tempfile.mkdtemp(prefix="fm-tests-")
    os.chmod(folder, 0o1777)  # as /tmp: tests run train.py as user nobody too
    os.environ["TMPDIR"] = folder
    _suite_tmp.append(folder)


def pytest_unconfigure(config):
    for folder in _suite_tmp:
        shutil.rmtree(folder, ignore_errors=True)


def _process_count(argv) -> int:
    """How many training processes one train.py command line starts (its --devices, or --nproc-per-node)."""
    argv = [str(a) for a in argv]
    count = 1
    for i, arg in enumerate(argv[:-1]):
        if arg in ("--devices", "--trainer.devices", "--nproc-per-node", "--nproc_per_node"):
            value = argv[i + 1]
            count = int(value) if value.isdigit() else 2  # a list or "auto": assume several
    return count


@pytest.fixture(autouse=True)
def _several_processes_need_the_multiprocess_mark(request, monkeypatch):
    """A test outside tests/unit that starts several training processes (one command with --devices N > 1, or
    several commands at once) must be marked ``multiprocess``, so that ``-m "not multiprocess"`` leaves it out."""
    if "tests/unit" in str(request.node.path).replace(os.sep, "/") or request.node.get_closest_marker("multiprocess"):
        return
    original_start, original_start_all = launch.start, launch.start_all
    name = request.node.nodeid

    def start(job_name, argv, *args, **kwargs):
        if _process_count(argv) > 1:
            pytest.fail(f"{name} starts {_process_count(argv)} training processes: mark it pytest.mark.multiprocess")
        return original_start(job_name, argv, *args, **kwargs)

    def start_all(commands, log_dir):
        if len(commands) > 1:
            pytest.fail(f"{name} starts {len(commands)} commands at once: mark it pytest.mark.multiprocess")
        return original_start_all(commands, log_dir)

    monkeypatch.setattr(launch, "start", start)
    monkeypatch.setattr(launch, "start_all", start_all)


@pytest.fixture(scope="session")
def fashion_root(tmp_path_factory) -> Path:
    """A folder holding FashionMNIST/raw with 256 training and 101 test images (odd on purpose)."""
    return write_fashion_mnist(tmp_path_factory.mktemp("data"))


@pytest.fixture
def damaged_copy(tmp_path, fashion_root):
    """A fresh copy of the tiny data set; the test damages one file of it."""
    root = tmp_path / "damaged"
    shutil.copytree(fashion_root, root)
    return root


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """Run in an empty folder, so runs/ and checkpoints land in tmp_path; no data dir from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FASHION_MNIST_DIR", raising=False)
    return tmp_path


def experiment_dir(cwd: Path) -> Path:
    """The one experiment folder a run made in ``cwd``: ``runs/<experiment>/``, holding its runs' folders, whatever the
    experiment was named."""
    found = [p for p in (Path(cwd) / "runs").iterdir() if p.is_dir()]
    assert len(found) == 1, f"expected one experiment folder in {cwd}/runs, found {[p.name for p in found]}"
    return found[0]


def run_dir(cwd: Path) -> Path:
    """The one run folder of the one experiment in ``cwd``: ``runs/<experiment>/<run>/`` (its checkpoints/, metrics.csv,
    TensorBoard's events, config.yaml, hparams.yaml, run.json), whatever the run was named."""
    found = [p for p in experiment_dir(cwd).iterdir() if p.is_dir()]
    assert len(found) == 1, f"expected one run folder in {experiment_dir(cwd)}, found {[p.name for p in found]}"
    return found[0]


# Who runs permission tests when the suite runs as root (root reads and writes whatever the modes say).
UNPRIVILEGED_UID = 65534  # nobody


def run_train(args, cwd: Path, timeout: float = 240, env=None, unprivileged: bool = False) -> launch.Finished:
    """``python train.py ARGS`` as a user runs it, in ``cwd``, with a hard timeout (benchmarks/launch.py).

    ``unprivileged``: when this suite runs as root, run as user nobody, so that file modes apply.
    """
    full_env = launch.clean_env(env)
    prefix = []
    if unprivileged and os.geteuid() == 0:
        # setpriv, not subprocess's user=: on the machine this was written on, only setpriv could exec the venv python.
        if shutil.which("setpriv") is None:
            pytest.skip("runs as root and setpriv (util-linux) is missing: cannot drop privileges")
        prefix = ["setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}", "--clear-groups"]
        full_env["HOME"] = str(cwd)
    return launch.run_train(args, cwd, timeout, full_env, prefix)


@pytest.fixture
def shared_tmp():
    """An empty folder every user may enter and write (pytest's own tmp_path is private to root when root runs
    the suite), for tests that run train.py as another user; removed afterwards, whatever its modes."""
    folder = Path(tempfile.mkdtemp(prefix="fashion-mnist-perm-"))
    folder.chmod(0o777)
    yield folder
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o777 if path.is_dir() else 0o666)
    shutil.rmtree(folder)


@pytest.fixture(scope="session")
def strategy_runs(fashion_root, tmp_path_factory):
    """Short mlp runs (tests/strategy_runs.py), each started once per session however many tests read it."""
    from tests.strategy_runs import StrategyRuns

    return StrategyRuns(fashion_root, tmp_path_factory.mktemp("strategy_runs"))


@pytest.fixture(scope="session")
def seeded_runs(fashion_root, tmp_path_factory):
    """Seeded, deterministic runs (tests/seeded_runs.py), each started once per session: determinism and restarts."""
    from tests.seeded_runs import SeededRuns

    return SeededRuns(fashion_root, tmp_path_factory.mktemp("seeded_runs"))


# Files whose tests read the same session-wide runs: under pytest-xdist they share a worker, so each run is made once.
SHARED_RUNS = {
    "tests/test_equivalence.py": "strategy_runs", "tests/test_fsdp.py": "strategy_runs",
    "tests/test_grad_noise.py": "strategy_runs",
    "tests/test_determinism.py": "seeded_runs", "tests/test_restarts.py": "seeded_runs",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs 2 pytest-xdist workers. Each file's tests run in one worker (as ``--dist loadfile``: its
    module-scoped runs are made once), and the files of one SHARED_RUNS group in the same worker. (xdist's own
    ``--dist loadgroup`` would do the latter with marks, but with pytest 9.2 it ignores them: pytest-xdist#1386.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunsScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_RUNS.get(path, path)

    return SharedRunsScheduling(config, log)
