"""A run's identity: its own folder under the experiment's, created atomically (``mkdir`` fails if the name is taken,
on one host or many sharing the folder), named by when it started and its seed; held by its rank 0 while it runs (a
POSIX lock, which the kernel drops however the process ends); ``run.json`` lists the jobs that trained it (SLURM's,
torchrun's), so a requeued job finds its own run. And which run ``--ckpt_path last`` resumes (docs/cli.md, "Where a
run's files go")."""

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from fashion_mnist_dp.runtime.errors import CantWriteError, ConfigError

RECORD = "run.json"
LOCK = ".lock"
NAME_LIMIT = 100  # characters of a --run_name: a folder name, with room for the experiment's below NAME_MAX


def job_keys(environ: Mapping[str, str] = os.environ) -> Tuple[str, ...]:
    """The jobs this process belongs to, as a requeue or a restart sees them again: SLURM's job (an array task's own
    id) and torchrun's run id (``none``, a static rendezvous without ``--rdzv-id``, names no job)."""
    keys = []
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        keys.append(f"SLURM job {environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}")
    elif environ.get("SLURM_JOB_ID"):
        keys.append(f"SLURM job {environ['SLURM_JOB_ID']}")
    if environ.get("TORCHELASTIC_RUN_ID", "none") not in ("", "none"):
        keys.append(f"torchrun run {environ['TORCHELASTIC_RUN_ID']}")
    return tuple(keys)


def restarted_job(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The job this process is a later start of (a SLURM requeue, a torchrun restart): it resumes its own run only."""
    for key in job_keys(environ):  # SLURM's first, then torchrun's
        restarts = "SLURM_RESTART_COUNT" if key.startswith("SLURM") else "TORCHELASTIC_RESTART_COUNT"
        if int(environ.get(restarts) or 0) > 0:
            return key
    return None


def name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be a run's folder, else None."""
    if not name.strip():
        return "is empty"
    if "/" in name or "\\" in name or "\0" in name:
        return "holds a path separator"
    if name.startswith("."):
        return "starts with a dot (., .. and hidden folders are not runs)"
    if len(name) > NAME_LIMIT:
        return f"is {len(name)} characters long (at most {NAME_LIMIT})"
    return None


def new_name(seed, subcommand: str = "fit", now: Optional[float] = None) -> str:
    """``20261201-233431-seed42``: when it started (UTC) and its seed; other subcommands say which (``-test``)."""
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    if isinstance(seed, int) and not isinstance(seed, bool):
        name += f"-seed{seed}"
    return name if subcommand == "fit" else f"{name}-{subcommand}"


@dataclass(frozen=True, order=True)
class Run:
    """One run's folder and what it holds."""

    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    def record(self) -> dict:
        try:
            return json.loads((self.folder / RECORD).read_text())
        except (OSError, ValueError):
            return {}

    def jobs(self) -> set:
        return {key for start in self.record().get("starts", []) for key in start.get("jobs", [])}

    def checkpoints(self, pattern: str = "last*.ckpt") -> List[Path]:
        return sorted((self.folder / "checkpoints").glob(pattern))

    def newest_ns(self) -> int:
        """When its newest last checkpoint was written (0: none)."""
        return max((p.stat().st_mtime_ns for p in self.checkpoints() if p.is_file()), default=0)

    def holder(self) -> Optional[str]:
        """Who runs it now ("host h, pid p, since T"), else None; None too where the file system has no locks."""
        if _held is not None and _held[0] == self.folder:
            return None  # this process: probing its own lock would drop it (a POSIX lock ends at any close)
        try:
            descriptor = os.open(self.folder / LOCK, os.O_RDWR)
        except OSError:
            return None
        try:
            fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            start = (self.record().get("starts") or [{}])[-1]
            return f"host {start.get('host', '?')}, pid {start.get('pid', '?')}, since {start.get('started', '?')}"
        except OSError:
            return None
        finally:
            os.close(descriptor)
        return None


def runs_of(experiment: Path) -> List[Run]:
    """The runs of an experiment: its folders that hold a run.json."""
    if not experiment.is_dir():
        return []
    return sorted(Run(p.parent) for p in experiment.glob(f"*/{RECORD}"))


_held: Optional[Tuple[Path, int]] = None  # the run folder this process holds, and the lock's descriptor


def hold(folder: Path, record: Dict, wait_s: float = 2.0) -> None:
    """Take the run's lock (for this process's lifetime, or :func:`release`) and add this start to its run.json; a
    run held by another process: one line, exit 2. ``wait_s``: other processes probe the lock for an instant."""
    global _held
    try:
        descriptor = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise CantWriteError(f"cannot write {folder / LOCK}: {error.strerror or error}") from error
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except (BlockingIOError, PermissionError):
            if time.monotonic() > deadline:
                os.close(descriptor)
                holder = Run(folder).holder() or "another process"
                raise ConfigError(f"run {folder} is running now ({holder}): two runs never share a folder; give "
                                  f"another --run_name, or resume it once it has ended") from None
            time.sleep(0.05)
        except OSError:  # no locks on this file system: the run goes on unheld
            break
    _held = (folder, descriptor)
    old = Run(folder).record()
    start = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
             "pid": os.getpid(), **record.pop("start", {})}
    _write_record(folder, {**old, **record, "starts": [*old.get("starts", []), start]})


def _write_record(folder: Path, record: Dict) -> None:
    path, partial = folder / RECORD, folder / f".{RECORD}.tmp-{os.getpid()}"
    try:
        with open(partial, "w") as handle:
            handle.write(json.dumps(record, indent=1) + "\n")
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise CantWriteError(f"cannot write {path}: {error.strerror or error}") from error


def release() -> None:
    """Drop the lock this process holds (an in-process caller of ``main`` starts the next run clean)."""
    global _held
    if _held is not None:
        with contextlib.suppress(OSError):
            os.close(_held[1])
        _held = None


def create(experiment: Path, base: str) -> Path:
    """A new run folder named ``base`` (``base-2``... when taken): ``mkdir`` is atomic, so two runs that start at the
    same second, on one host or on two sharing the folder, never get the same one."""
    try:
        experiment.mkdir(parents=True, exist_ok=True)
        for number in range(1, 10_000):
            folder = experiment / (base if number == 1 else f"{base}-{number}")
            with contextlib.suppress(FileExistsError):
                folder.mkdir()
                return folder
    except OSError as error:
        raise CantWriteError(f"cannot create a run folder in {experiment}: {error.strerror or error}") from error
    raise CantWriteError(f"cannot create a run folder in {experiment}: {base} and 9,999 numbered ones exist")


def refuse_running(experiment: Path) -> None:
    """``last`` without a name never picks among runs of another job that are running now: one line, exit 2."""
    running = [f"{run.name} ({holder})" for run in runs_of(experiment) if (holder := run.holder())]
    if running:
        below = os.path.relpath(experiment)  # below the working folder: as a relative root names it, whoever asks
        shown = experiment if below.startswith("..") else below
        raise ConfigError(f"--ckpt_path last is ambiguous: {len(running)} run(s) of {shown} are running now, not "
                          f"as this job: {', '.join(running)}; resume a run that has ended with --ckpt_path last "
                          f"--run_name NAME")


def claim(experiment: Path, name: Optional[str], continued: bool, newest: bool, base: str, record: Dict) -> Path:
    """Rank 0, before launch: the run's folder (``name``'s, continued or new, else a new one from ``base``), held.
    ``newest``: ``last`` chose the experiment's newest run, which no running run of another job may leave in doubt."""
    if newest:
        refuse_running(experiment)
    if name is None:
        folder = create(experiment, base)
    else:
        folder = experiment / name
        try:
            folder.mkdir(parents=True, exist_ok=continued)
        except FileExistsError:
            if holder := Run(folder).holder():
                raise ConfigError(f"--run_name {name}: run {folder} is running now ({holder}); give another "
                                  f"--run_name") from None
            raise ConfigError(f"--run_name {name}: run {folder} exists already; resume it with --ckpt_path last "
                              f"--run_name {name}, or give another --run_name") from None
        except OSError as error:
            raise CantWriteError(f"cannot create the run folder {folder}: {error.strerror or error}") from error
    hold(folder, {**record, "run": folder.name})
    return folder
