"""No unbounded hang: a default collective timeout for every ddp/fsdp strategy, and ranks that die with their launcher.

Lightning's ``DDPStrategy`` and ``FSDPStrategy`` default to torch's process-group timeout
(30 minutes for gloo), so a rank stuck in a collective holds the job for half an hour.
:func:`set_collective_timeout` puts ``timeout=`` into every registered ddp/fsdp strategy name
(``ddp``, ``ddp_spawn``, ``fsdp``, ``fsdp_cpu``...): ``$FASHION_MNIST_COLLECTIVE_TIMEOUT`` seconds,
default 300, for gloo and NCCL alike. It bounds every collective and the rendezvous at start.
A strategy given as an object in a config file (``class_path`` with ``init_args``) keeps its own.

:func:`die_with_parent`: a rank started by a launcher (Lightning's ddp launcher, torchrun, srun)
asks Linux to SIGKILL it when that launcher dies (``prctl(PR_SET_PDEATHSIG)``). Without it a
rank whose launcher was SIGKILLed lives on until its next collective fails or times out.
"""

import ctypes
import os
import signal
import sys
from datetime import timedelta
from typing import Optional

from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, StrategyRegistry

TIMEOUT_ENV = "FASHION_MNIST_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
PR_SET_PDEATHSIG = 1


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


def die_with_parent() -> bool:
    """In a rank started by a launcher (``LOCAL_RANK`` or ``SLURM_PROCID`` set), be SIGKILLed when the launcher dies. Linux only.

    Returns whether it was set. If the launcher died before the request took effect (the parent changed),
    exit at once.
    """
    if not sys.platform.startswith("linux") or not ({"LOCAL_RANK", "SLURM_PROCID"} & set(os.environ)):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)
    return True
