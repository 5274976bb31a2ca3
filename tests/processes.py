"""Several training processes at once, each with a hard deadline; on timeout every process they started dies.

``subprocess.run(timeout=...)`` kills only the process it started. torchrun's workers run
in sessions of their own and Lightning's ddp launcher starts its ranks as children, so
here the whole tree is found through /proc and killed (Linux, as CI).
"""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

# Variables of an outer launcher or cluster that would change how a child finds its rank and its peers.
LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                "NODE_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "FASHION_MNIST_DIR")


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This environment without launcher, cluster (SLURM_*) or data-dir variables, unbuffered, one thread each."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and not k.startswith("SLURM_")}
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


def process_tree(pid: int) -> Set[Tuple[int, int]]:
    """``pid`` and every live process below it, whatever its session, as (pid, start time)."""
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


def _signal(tree: Set[Tuple[int, int]], sig: int) -> None:
    for pid, started in tree:
        stat = _stat(pid)
        if stat is not None and stat[1] == started:  # the same process, not a new one that reused its pid
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


@dataclass
class Job:
    """One started command; its stdout and stderr go to files next to (not inside) its working directory."""

    name: str
    proc: subprocess.Popen
    cwd: Path
    stdout_path: Path
    stderr_path: Path

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


def start(name: str, argv: Sequence[str], cwd: Path, log_dir: Path, env: Dict[str, str]) -> Job:
    """``sys.executable ARGV`` in ``cwd``, in a new session, output to ``log_dir/NAME.out|.err``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out, err = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Job(name, proc, cwd, out, err)


def _alive(tree: Set[Tuple[int, int]]) -> bool:
    return any(_stat(pid) is not None and _stat(pid)[1] == started for pid, started in tree)


def stop(jobs: Sequence[Job], grace_s: float = 10.0) -> None:
    """SIGTERM each running job's tree (torchrun then stops its workers itself), SIGKILL what is left after ``grace_s``.

    The tree is taken before any signal (a worker whose parent died is no longer below it), and
    only below a job not yet reaped: a reaped job's pid may already belong to someone else.
    """
    trees = [process_tree(job.proc.pid) if job.proc.poll() is None else set() for job in jobs]
    for tree in trees:
        _signal(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (any(job.proc.poll() is None for job in jobs) or any(map(_alive, trees))):
        time.sleep(0.2)
    for job, tree in zip(jobs, trees):
        if job.proc.poll() is None:
            tree = tree | process_tree(job.proc.pid)
        _signal(tree, signal.SIGKILL)
        job.proc.wait()


def wait_all(jobs: Sequence[Job], timeout_s: float) -> Optional[str]:
    """Wait for every job until one shared deadline; on timeout stop them all and return why, else None."""
    deadline = time.monotonic() + timeout_s
    try:
        for job in jobs:
            job.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop(jobs)
        return f"timed out after {timeout_s:.0f} s:\n" + "\n".join(job.tail() for job in jobs)
    finally:
        stop(jobs)  # nothing left behind, also when the caller's assertion fails next
    return None
