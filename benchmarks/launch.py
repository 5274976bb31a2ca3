"""Run train.py (or torchrun) as subprocesses: the one launcher of tests, experiments and benchmarks. Each job gets a
clean environment, its own session, output files and a hard deadline; :func:`stop` then ends its process group and
everything below it (found through /proc), so Lightning's ranks and torchrun's workers never outlive it."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
TRAIN_PY = REPO / "train.py"
# Variables of an outer launcher or cluster that would change how a child finds its rank and its peers.
LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                "NODE_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "FASHION_MNIST_DIR")


def clean_env(extra: Optional[Dict[str, str]] = None, keep_data_dir: bool = False) -> Dict[str, str]:
    """This environment without launcher or cluster (SLURM_*) variables, nor ``FASHION_MNIST_DIR`` unless
    ``keep_data_dir`` (then made absolute: the children run in other folders); unbuffered, one thread per process
    (``extra`` may say otherwise)."""
    dropped = [k for k in LAUNCHER_ENV if not (keep_data_dir and k == "FASHION_MNIST_DIR")]
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("SLURM_")}
    if env.get("FASHION_MNIST_DIR"):
        env["FASHION_MNIST_DIR"] = os.path.abspath(env["FASHION_MNIST_DIR"])
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, **(extra or {}))
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's choice for bind(0))."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stat(pid: int) -> Optional[Tuple[int, int]]:
    """(parent pid, start time in clock ticks) of a running process, else None (gone, or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in "ZX" else (int(fields[1]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def running_in(folder: Path) -> List[int]:
    """Pids of the running processes whose working directory is ``folder``: a job's ranks, orphans included."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _stat(int(entry.name)) is not None:
            try:
                if Path(os.readlink(entry / "cwd")) == Path(folder).resolve():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def process_tree(pid: int) -> Set[Tuple[int, int]]:
    """Every running process below ``pid`` (and ``pid`` itself), whatever its session, as (pid, start time)."""
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if (stat := _stat(current)) is not None:
            found.add((current, stat[1]))
        todo.extend(children.get(current, []))
    return found


def _alive(tree: Set[Tuple[int, int]]) -> Set[Tuple[int, int]]:
    """The members of ``tree`` still running: same pid and same start time (not a new process that reused the pid)."""
    return {(pid, started) for pid, started in tree if (stat := _stat(pid)) is not None and stat[1] == started}


@dataclass
class Job:
    """One started command; its stdout and stderr go to files next to (not inside) its working directory."""

    name: str
    proc: subprocess.Popen
    cwd: Path
    stdout_path: Path
    stderr_path: Path

    def exited(self) -> bool:
        """Whether the process has ended, without reaping it (its pid stays reserved until ``stop``)."""
        if self.proc.returncode is not None:
            return True
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def signal_all(self, tree: Set[Tuple[int, int]], sig: int) -> None:
        if self.proc.returncode is None:  # not reaped: the group id is still ours
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        for pid, _ in _alive(tree):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.name} (exit {self.returncode}) stderr tail:\n{self.stderr[-chars:]}"


def start(name: str, argv: Sequence[str], cwd: Path, log_dir: Path, env: Dict[str, str],
          prefix: Sequence[str] = ()) -> Job:
    """``[PREFIX] sys.executable ARGV`` in ``cwd``, in a new session, output to ``log_dir/NAME.out|.err``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out, err = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([*prefix, sys.executable, *argv], cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Job(name, proc, cwd, out, err)


def start_all(commands: Sequence[Tuple[str, Sequence[str], Path, Dict[str, str]]], log_dir: Path) -> List[Job]:
    """``start`` each (name, argv, cwd, env) right after the other; if one cannot start, stop those already running."""
    jobs: List[Job] = []
    try:
        for name, argv, cwd, env in commands:
            jobs.append(start(name, argv, cwd, log_dir, env))
    except BaseException:
        stop(jobs)
        raise
    return jobs


def stop(jobs: Sequence[Job], grace_s: float = 10.0) -> None:
    """SIGTERM each job's group and tree (torchrun then stops its workers), SIGKILL what is left after ``grace_s``,
    then reap the jobs. The trees are taken before any signal (an orphan is no longer below its job), and only for
    jobs not reaped yet (a reaped job's pid may already be someone else's)."""
    jobs = [job for job in jobs if job.proc.returncode is None]
    trees = [process_tree(job.proc.pid) for job in jobs]
    for job, tree in zip(jobs, trees):
        job.signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(job.exited() and not _alive(tree) for job, tree in zip(jobs, trees)):
        time.sleep(0.1)
    for job, tree in zip(jobs, trees):
        job.signal_all(tree | process_tree(job.proc.pid), signal.SIGKILL)
        job.proc.wait()


def wait_all(jobs: Sequence[Job], timeout_s: float) -> Optional[str]:
    """Wait for every job until one shared deadline, then ``stop`` them all: returns why on timeout, else None."""
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while not all(job.exited() for job in jobs):
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        stop(jobs)  # also reaps them; runs too when the wait itself fails
    if timed_out:
        return f"timed out after {timeout_s:.0f} s:\n" + "\n".join(job.tail() for job in jobs)
    return None


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_train(args: Sequence[str], cwd: Path, timeout_s: float = 240, env: Optional[Dict[str, str]] = None,
              prefix: Sequence[str] = (), train_py: Path = TRAIN_PY) -> Finished:
    """``python train.py ARGS`` in ``cwd`` as a user runs it (``env`` defaults to :func:`clean_env`), to its end;
    raises TimeoutError (after stopping it and everything it started) past ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="train-py-logs-") as logs:
        job = start("train", [str(train_py), *args], Path(cwd), Path(logs), clean_env() if env is None else env,
                    prefix)
        timed_out = wait_all([job], timeout_s)
        if timed_out:
            raise TimeoutError(timed_out)
        return Finished(job.returncode, job.stdout, job.stderr)


def train_record(args: Sequence[str], timeout_s: float = 900, threads: Optional[int] = None,
                 read: Optional[Callable[[Path], Any]] = None, train_py: Path = TRAIN_PY):
    """:func:`run_train` in a fresh temporary folder, ``$FASHION_MNIST_DIR`` kept, ``threads`` OpenMP threads (None:
    torch's choice); returns ``read(its runs folder)`` (default: callbacks/run_record.py's ``read_run``) before the
    folder goes. A failed run, or a RuntimeError of ``read``, ends the calling tool (SystemExit with why)."""
    from callbacks.run_record import read_run  # imports lightning: only when a tool trains

    env = clean_env(keep_data_dir=True)
    if threads is None:
        env.pop("OMP_NUM_THREADS")
    else:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory(prefix="train-py-") as cwd:
        finished = run_train(args, Path(cwd), timeout_s, env, train_py=train_py)
        if finished.returncode != 0:
            raise SystemExit(f"{train_py} {' '.join(args)} exited {finished.returncode}:\n{finished.stderr[-3000:]}")
        try:
            return (read or read_run)(Path(cwd) / "runs")
        except RuntimeError as error:
            raise SystemExit(str(error)) from error


def python_ranks(code: str, args: Sequence[str], ranks: int, gloo: bool = False) -> List[subprocess.Popen]:
    """``ranks`` processes of ``python -c CODE ARGS`` in the repository, one thread each, stdin and stdout piped;
    ``gloo``: as the ranks of one process group on 127.0.0.1 (``dist.init_process_group("gloo")`` finds it)."""
    group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks)} if gloo else {}
    return [subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=REPO, text=True,
                             env=clean_env({**group, **({"RANK": str(rank)} if gloo else {})}),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE) for rank in range(ranks)]


def outputs(procs: Sequence[subprocess.Popen], before: Callable[[], None] = lambda: None,
            timeout_s: float = 300) -> List[str]:
    """Run ``before``, then each process's whole stdout; none of them is left running."""
    try:
        before()
        return [proc.communicate(timeout=timeout_s)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
