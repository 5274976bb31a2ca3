"""Process lifetime: no collective waits forever, ranks die with their launcher, data workers cannot stall a rank,
torchrun's restarts: docs/reliability.md, "No hang"."""

import atexit
import contextlib
import multiprocessing
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Mapping, NoReturn, Optional

import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, StrategyRegistry

from fashion_mnist_dp.runtime import compat
from fashion_mnist_dp.runtime.errors import ConfigError

TIMEOUT_ENV = "FASHION_MNIST_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
LAUNCHER_PID_ENV = "FASHION_MNIST_LAUNCHER_PID"  # set by a launching train.py for the ranks it starts
DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def collective_timeout(environ: Mapping[str, str] = os.environ, seconds: Optional[float] = None) -> timedelta:
    """``collective_timeout``, else ``$FASHION_MNIST_COLLECTIVE_TIMEOUT``, else 300 s; ConfigError unless > 0."""
    name, raw = (TIMEOUT_ENV, environ.get(TIMEOUT_ENV, "")) if seconds is None else ("collective_timeout", str(seconds))
    if not raw.strip():
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a number of seconds > 0; got {raw.strip()!r}")
    return timedelta(seconds=value)


def set_collective_timeout(timeout: timedelta) -> timedelta:
    """Give every registered ddp/fsdp strategy name ``timeout`` (else torch's 30 min)."""
    for entry in StrategyRegistry.values():  # each has its strategy (a class, or any callable) and init_params
        strategy = entry["strategy"]
        if isinstance(strategy, type) and issubclass(strategy, (DDPStrategy, FSDPStrategy, ModelParallelStrategy)):
            entry["init_params"]["timeout"] = timeout
    return timeout


def configured_timeout() -> Optional[timedelta]:
    """The timeout this process gave the strategies (:func:`set_collective_timeout`), else the environment's; None
    when that is not a number of seconds > 0 (its own line says so)."""
    try:  # Lightning registers ddp on import; only set_collective_timeout puts a timeout in its init_params
        return StrategyRegistry["ddp"]["init_params"].get("timeout") or collective_timeout()
    except ValueError:
        return None


def is_launched_rank(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether some launcher (Lightning's, torchrun, srun) started this process as a rank."""
    return bool({"LOCAL_RANK", "SLURM_PROCID"} & set(environ))


def probably_global_rank_zero(environ: Mapping[str, str] = os.environ) -> bool:
    """Rank 0 as the launchers' variables tell it before any process group exists."""
    return all(environ.get(name, "0") == "0" for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK",
                                                           "LOCAL_RANK"))


def release_process_group() -> None:
    """Destroy the default process group of a run without peers (an in-process caller of ``main`` gets a clean state).
    A group with peers stays up: :func:`exit_process` ends the rank without the interpreter's teardown."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() == 1:
        with contextlib.suppress(RuntimeError):  # on the way out after a fault: the exit code and its line stand
            torch.distributed.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End train.py with ``code``. A rank whose process group has peers leaves with ``os._exit`` once the atexit
    handlers have run and its output is flushed: gloo closes its connections in destructors that race the peers' own
    exits, and either hang (torch 2.6: a rank stuck in destroy_process_group for minutes after its peer had left) or
    abort the rank (exit -6, pytorch/pytorch#190489): docs/reliability.md, "No hang"."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        compat.run_exit_handlers()  # what the interpreter's exit would run first (data workers, logging...)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


def kill_data_workers() -> None:
    """SIGKILL this process's data workers (a rank ending because one stalled: torch would wait 5 s per loader)."""
    children = multiprocessing.active_children()
    if not children:
        return
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would raise "worker killed" from the next line
    for child in children:
        with contextlib.suppress(OSError):
            child.kill()
    for child in children:
        child.join(timeout=5)


def kill_data_workers_at_exit() -> None:
    """:func:`kill_data_workers` at exit, once however often asked, before multiprocessing's exit hook (registered at
    its import), which would wait forever for a worker that is stuck or ignores SIGTERM (init_data_worker does)."""
    atexit.unregister(kill_data_workers)
    atexit.register(kill_data_workers)


def kernel() -> Optional[str]:
    """This process's kernel (its boot) and pid namespace: processes that share both see each other's pids in /proc
    (None where /proc is another namespace's, or missing, as on macOS: a rank's end is known from its launcher only)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        return f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip()} {os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def running(pid: int) -> bool:
    """Whether process ``pid`` of this pid namespace runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def int_from(environ: Mapping[str, str], name: str) -> int:
    try:
        return max(0, int(environ.get(name, "0") or 0))
    except ValueError:
        return 0


def max_restarts(environ: Mapping[str, str] = os.environ) -> int:
    """torchrun's ``--max-restarts`` when this process is one of its workers, else 0."""
    return int_from(environ, "TORCHELASTIC_MAX_RESTARTS")


def attempt(environ: Mapping[str, str] = os.environ) -> int:
    """1 for torchrun's first attempt (and outside torchrun), 2 after its first restart, ..."""
    return int_from(environ, "TORCHELASTIC_RESTART_COUNT") + 1


def shared_store_warning(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The line to print when torchrun may restart this job but shares its rendezvous store with it, else None."""
    if max_restarts(environ) == 0 or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return (f"torchrun --max-restarts {max_restarts(environ)} shares its rendezvous store with the workers, so a "
            f"restart can fail to connect or hang (pytorch/pytorch#135712): start torchrun with "
            f"{DISABLE_SHARED_STORE}=1 in its environment and its c10d rendezvous (no --master-port on one node; "
            f"--rdzv-backend c10d --rdzv-endpoint HOST:PORT on several)")
