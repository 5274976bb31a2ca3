"""No unbounded hang: a default collective timeout for every ddp/fsdp strategy, ranks that die with their launcher,
and data-loader workers that cannot stall a rank for longer than half of that timeout.

Lightning's ``DDPStrategy`` and ``FSDPStrategy`` default to torch's process-group timeout
(30 minutes for gloo), so a rank stuck in a collective holds the job for half an hour.
:func:`set_collective_timeout` puts ``timeout=`` into every registered ddp/fsdp strategy name
(``ddp``, ``ddp_spawn``, ``fsdp``, ``fsdp_cpu``...): ``$FASHION_MNIST_COLLECTIVE_TIMEOUT`` seconds,
default 300, for gloo and NCCL alike. It bounds every collective and the rendezvous at start.
A strategy given as an object in a config file (``class_path`` with ``init_args``) keeps its own.

:func:`die_with_parent`: a rank started by a launcher (Lightning's ddp launcher, torchrun, srun)
asks Linux to SIGKILL it when that launcher dies (``prctl(PR_SET_PDEATHSIG)``). Without it a
rank whose launcher was SIGKILLed lives on until its next collective fails or times out. A
rank that Lightning's launcher started (its parent is a train.py) also checks, once the request
is in place, that its parent is still that train.py (:func:`mark_launcher`): a launcher that
failed while the rank was still importing torch (a busy MASTER_PORT) would otherwise leave it
running until its own rendezvous timed out.

:func:`data_worker_timeout` and :func:`init_data_worker`: with ``--data.num_workers`` > 0 a
rank waits at most half the collective timeout for a batch (torch waits forever by default),
so a stalled worker is reported by the rank it belongs to, before the other ranks' collectives
time out; the workers die with their rank and leave the rank's signals (SIGTERM, SIGUSR1,
Ctrl-C) to it.
"""

import atexit
import ctypes
import multiprocessing
import os
import signal
import sys
from datetime import timedelta
from typing import Optional

from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, StrategyRegistry

TIMEOUT_ENV = "FASHION_MNIST_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
PR_SET_PDEATHSIG = 1
LAUNCHER_PID_ENV = "FASHION_MNIST_LAUNCHER_PID"  # set by a launching train.py for the ranks it starts


def collective_timeout(environ=os.environ) -> timedelta:
    """``$FASHION_MNIST_COLLECTIVE_TIMEOUT`` (seconds, > 0), else 300 s. A bad value raises ValueError."""
    raw = environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds > 0; got {raw!r}")
    return timedelta(seconds=seconds)


def set_collective_timeout(timeout: Optional[timedelta] = None) -> timedelta:
    """Give every registered ddp/fsdp strategy name ``timeout`` (default: :func:`collective_timeout`). Idempotent."""
    timeout = collective_timeout() if timeout is None else timeout
    for name in list(StrategyRegistry):
        entry = StrategyRegistry[name]
        strategy = entry.get("strategy")
        if isinstance(strategy, type) and issubclass(strategy, (DDPStrategy, FSDPStrategy)):
            entry.setdefault("init_params", {})["timeout"] = timeout
    return timeout


def is_launched_rank(environ=os.environ) -> bool:
    """Whether this process is a rank some launcher started (Lightning's ddp launcher, torchrun, srun)."""
    return bool({"LOCAL_RANK", "SLURM_PROCID"} & set(environ))


def mark_launcher(environ=os.environ) -> None:
    """In a launching train.py (not itself a launched rank), tell the ranks it will start its pid."""
    if not is_launched_rank(environ):
        environ[LAUNCHER_PID_ENV] = str(os.getpid())


def _set_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; whether the request took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(environ=os.environ) -> bool:
    """In a rank started by a launcher (``LOCAL_RANK`` or ``SLURM_PROCID`` set), be SIGKILLed when the launcher dies. Linux only.

    Returns whether it was set. If the launcher died before the request took effect (the parent changed, or
    is not the train.py that started this rank), exit at once.
    """
    if not is_launched_rank(environ):
        return False
    parent = os.getppid()
    if not _set_death_signal():
        return False
    # Lightning's launcher's ranks only (torchrun's and srun's have their agent as parent).
    lightning_rank = not ({"TORCHELASTIC_RUN_ID", "SLURM_PROCID"} & set(environ))
    launcher = environ.get(LAUNCHER_PID_ENV, "") if lightning_rank else ""
    if os.getppid() != parent or (launcher.isdigit() and int(launcher) != parent):
        os._exit(128 + signal.SIGKILL)
    return True


def data_worker_timeout(environ=os.environ) -> float:
    """Seconds a rank waits for a batch from its DataLoader workers: half the collective timeout, so that a
    stalled worker is reported by its own rank before the other ranks' collectives time out."""
    return collective_timeout(environ).total_seconds() / 2


def init_data_worker(worker_id: int) -> None:
    """``worker_init_fn`` of every DataLoader with workers: die with the rank; leave its signals to it.

    A worker is forked with the rank's signal handlers (callbacks/preemption.py), which would only note
    a SIGTERM and keep a stuck worker alive; SIGINT, SIGTERM and SIGUSR1 are the rank's to act on (it
    stops at the next step and shuts its workers down). A worker stuck for good is SIGKILLed by the
    rank (:func:`kill_data_workers`) or dies with it.
    """
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
    rank = multiprocessing.parent_process()
    if _set_death_signal() and rank is not None and os.getppid() != rank.pid:
        os._exit(1)  # the rank died before the request took effect


_cleanup_registered = False


def kill_stuck_workers_at_exit() -> None:
    """Register (once) an exit hook that SIGKILLs this process's data workers still running.

    torch's DataLoader ends a worker that does not stop with SIGTERM, which these workers ignore, and
    multiprocessing's own exit hook then waits for it forever. Registered after multiprocessing's hook,
    so it runs before it.
    """
    global _cleanup_registered
    if not _cleanup_registered:
        _cleanup_registered = True
        atexit.register(kill_data_workers)


def kill_data_workers() -> None:
    """SIGKILL this process's multiprocessing children (its DataLoader workers): for a rank that is ending because
    a worker stalled. torch's shutdown would wait 5 s for each stuck worker, per loader, before giving up on it
    (long enough for the other ranks' collectives to time out first), and its SIGCHLD handler would raise
    "worker killed" from whatever code runs next: it is switched off first (the rank is ending)."""
    children = multiprocessing.active_children()
    if not children:
        return
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        try:
            child.kill()
        except OSError:
            pass
    for child in children:
        child.join(timeout=5)
