"""Every error a user may see, one class per exit code (fashion_mnist_dp/exit_codes.py); ``reported`` turns each into
one line and its code, never a traceback; anything else keeps its traceback (exit 1): a bug (docs/cli.md)."""

import errno
import re
import subprocess
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException

from datamodules.files import CorruptDataError, DataNotFoundError
from fashion_mnist_dp.exit_codes import ExitCode
from fashion_mnist_dp.runtime.faults import describe_fault


class UserFacingError(Exception):
    """An error whose message is the whole story; one class per exit code, whose attributes say how it is reported."""

    exit_code: int = ExitCode.USAGE
    prefix = "error: "  # after "train.py: "
    hint = ""  # appended to the line
    to_stdout = False
    every_rank = True  # False: raised on every rank at once, rank 0 alone prints
    children_grace_s = 30.0  # for the rank processes this launching process waits for before it exits
    printed = False  # its line is already out (a stop prints it before any rank may exit)

    def __init__(self, *args, rank: Optional[int] = None, children: Sequence = ()) -> None:
        super().__init__(*args)
        self.rank, self.children = rank, list(children)  # rank: the global rank that raised it (None: unknown)


class ConfigError(UserFacingError, ValueError):
    """A flag, value or configuration that cannot run: the same on every rank, so rank 0 says it."""
    hint = " (see python train.py --help)"
    every_rank = False


class DataError(UserFacingError):
    """The data's own errors (datamodules/files.py): IDX files missing and not downloadable, or damaged."""
    exit_code = ExitCode.DATA


class CheckpointError(UserFacingError, ValueError):
    """``--ckpt_path`` names nothing loadable, or a checkpoint that is damaged, unverified, holds code or would import
    a module: not loaded."""
    exit_code = ExitCode.CHECKPOINT
    path, reason = "", ""

    @classmethod
    def damaged(cls, path, reason: str) -> "CheckpointError":
        error = cls(f"checkpoint {path} is damaged: {reason}")
        error.path, error.reason = str(path), reason
        return error


class CantWriteError(UserFacingError, OSError):
    """A folder the run must write to is a file or not writable, or a checkpoint could not be written."""
    exit_code = ExitCode.CANT_CREATE


class NothingToTrain(UserFacingError):
    """``fit`` from a checkpoint that already finished (a requeued job that had completed): exit 0."""
    exit_code = ExitCode.OK
    prefix = ""
    to_stdout = True


class JobFault(UserFacingError):
    """A fault of the job (runtime/faults.py): every rank that sees it says so; its ranks get 2 s to end."""
    exit_code = ExitCode.TEMPFAIL
    children_grace_s = 2.0


class TrainingDiverged(UserFacingError):
    """Raised on every rank at the same step (runtime/divergence.py); rank 0 prints the line."""
    exit_code = ExitCode.DIVERGED
    every_rank = False


class Preempted(UserFacingError):
    """A signal: 143 (SIGTERM, SIGUSR1) or 130 (Ctrl-C); a stop of every rank after a verified last.ckpt, rank 0 says
    it, or (``every_rank``) a Ctrl-C where this process had no step to stop at."""
    prefix = ""

    def __init__(self, message: str, exit_code: int, rank: Optional[int] = None, children: Sequence = (),
                 every_rank: bool = False) -> None:
        super().__init__(message, rank=rank, children=children)
        self.exit_code, self.every_rank = exit_code, every_rank


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


def one_line(error: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(error).split())


def note_failed_write(what: str, error: OSError) -> None:
    """A write on a failure path failed: named in the stop line, as a note on the exception being handled."""
    handled = sys.exc_info()[1]
    if handled is not None:
        handled.add_note(f"{what} not written either: {error.strerror or error}")


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
    return None if line is None else JobFault(line, children=getattr(error, "children", ()))


def wait_for(children: Sequence, timeout_s: float = 30.0) -> None:
    """Wait for the ranks this process launched; SIGKILL those left after ``timeout_s`` (a stuck one ignores TERM)."""
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def print_line(error: UserFacingError, notes: Sequence[str] = ()) -> None:
    """The error's one line on stderr (stdout for a run that ends well), with the writes that failed on the way out."""
    stream = sys.stdout if error.to_stdout else sys.stderr
    extra = "".join(f"; {note}" for note in notes)
    print(f"train.py: {error.prefix}{one_line(error)}{extra}{error.hint}", file=stream, flush=True)
    error.printed = True


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
        exiting(int(error.exit_code))
        if error.every_rank and error.exit_code != ExitCode.OK:
            failed_alone()
        wait_for(error.children, error.children_grace_s)
        return int(error.exit_code)
