"""What a failure becomes: one line and the exit code of its class (runtime/errors.py), never a traceback; anything
else keeps its traceback (exit 1): a bug (docs/cli.md)."""

import errno
import re
import subprocess
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException

from datamodules.files import CorruptDataError, DataNotFoundError
from fashion_mnist_dp.exit_codes import ExitCode
from fashion_mnist_dp.runtime.errors import (CantWriteError, ConfigError, DataError, JobFault, Preempted,
                                             UserFacingError, one_line, print_line)
from fashion_mnist_dp.runtime import hangs
from fashion_mnist_dp.runtime.faults import describe_fault


def failed_constructor(error: BaseException, classes: Dict[str, str]) -> Optional[Tuple[str, str, BaseException]]:
    """(key, class path, exception) of the innermost constructor of ``classes`` (key -> class path) that raised
    ``error`` or an exception it was raised from (jsonargparse wraps a callback's); None when none did."""
    seen: List[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    for raised in reversed(seen):  # the original first
        found = None
        for frame, _ in traceback.walk_tb(raised.__traceback__):
            built = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
            path = f"{type(built).__module__}.{type(built).__qualname__}" if built is not None else None
            found = next(((key, value, raised) for key, value in classes.items() if value == path), found)
        if found is not None:
            return found
    return None


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
_VAL_CHECK_BEYOND_EPOCH = re.compile(
    r"`val_check_interval` \((\d+)\) must be less than or equal to the number of the training batches \((\d+)\)")


def as_user_facing(error: BaseException, rank: Optional[int] = None) -> Optional[UserFacingError]:
    """The table's entry for ``error``: itself, or the user-facing error a foreign one stands for; None for a bug."""
    if isinstance(error, UserFacingError):
        return error
    if isinstance(error, ArgumentError):  # without jsonargparse's dump of a class path argument's type and value
        line = re.sub(r"Type typing\.Callable\[.*?\] expects a function or a callable class: ", "", one_line(error))
        return ConfigError(re.sub(r"\.? Got value: Namespace\(.*\)$", ".", line))
    if isinstance(error, MisconfigurationException):
        return ConfigError(one_line(error))
    if isinstance(error, (DataNotFoundError, CorruptDataError)):
        return DataError(one_line(error))
    if isinstance(error, KeyboardInterrupt):
        return Preempted("interrupted (Ctrl-C)", ExitCode.INTERRUPTED, every_rank=True)  # no step to stop at
    if isinstance(error, OSError) and error.errno in _DISK_FULL:  # a write of the run's: Lightning's, TensorBoard's...
        return CantWriteError(f"cannot write {error.filename or 'a file of the run'}: {error.strerror}")
    interval = _VAL_CHECK_BEYOND_EPOCH.search(one_line(error)) if isinstance(error, ValueError) else None
    if interval:  # Lightning's fit loop, once the loader's length is known
        wanted, batches = interval.groups()
        return ConfigError(f"trainer.val_check_interval is {wanted}, more than the {batches} training batches of an "
                           f"epoch: give at most {batches}, a fraction of the epoch in (0.0, 1.0], or also "
                           f"--trainer.check_val_every_n_epoch null to count batches across epochs")
    line = describe_fault(error, rank)
    if line is None:
        return None
    fault = JobFault(line, children=getattr(error, "children", ()))
    fault.report = getattr(error, "report", ())
    return fault


def wait_for(children: Sequence, timeout_s: float = 30.0) -> None:
    """Wait for the ranks this process launched; SIGKILL those left after ``timeout_s`` (a stuck one ignores TERM)."""
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def reported(run: Callable[[], Sequence], rank: Callable[[], int] = lambda: 0,
             failed_alone: Callable[[], object] = lambda: None, exiting: Callable[[int], object] = lambda code: None
             ) -> int:
    """Run ``run`` (it returns the ranks it launched) and return 0, or the table's code after the error's one line.
    ``failed_alone()``: the failure may be this process's alone (signals.end_peer_tasks); ``exiting(code)``: the line
    is out (signals.Handlers.exiting)."""
    try:
        wait_for(run())
        return ExitCode.OK
    except BaseException as raw:  # noqa: B902 (SystemExit, from argparse or Lightning's Ctrl-C path, passes through)
        if isinstance(raw, SystemExit):
            raise
        error = as_user_facing(raw, rank())
        if error is None:
            failed_alone()
            raise
        if not error.printed and (error.every_rank or (rank() if error.rank is None else error.rank) == 0):
            print_line(error, getattr(raw, "__notes__", ()))
        hangs.end_others()  # a hang report's: its lines are out
        exiting(int(error.exit_code))
        if error.every_rank and error.exit_code != ExitCode.OK:
            failed_alone()
        wait_for(error.children, error.children_grace_s)
        return int(error.exit_code)
