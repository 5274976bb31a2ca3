"""Every error a user may see, one class per exit code (fashion_mnist_dp/exit_codes.py), and the one line each ends
in. A leaf: what turns any exception into one of these is fashion_mnist_dp/cli/failures.py, beside ``main``."""

import sys
from typing import Optional, Sequence

from fashion_mnist_dp.exit_codes import ExitCode


class UserFacingError(Exception):
    """An error whose message is the whole story; one class per exit code, whose attributes say how it is reported."""

    exit_code: int = ExitCode.USAGE
    prefix = "error: "  # after "train.py: "
    hint = ""  # appended to the line
    to_stdout = False
    every_rank = True  # False: raised on every rank at once, rank 0 alone prints
    children_grace_s = 30.0  # for the rank processes this launching process waits for before it exits
    printed = False  # its line is already out (a stop prints it before any rank may exit)
    report: Sequence[str] = ()  # lines after its own: the hang report of a fault (runtime/hangs.py)

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


def one_line(error: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(error).split())


def print_line(error: UserFacingError, notes: Sequence[str] = ()) -> None:
    """The error's one line on stderr (stdout for a run that ends well), with the writes that failed on the way out."""
    stream = sys.stdout if error.to_stdout else sys.stderr
    extra = "".join(f"; {note}" for note in notes)
    print(f"train.py: {error.prefix}{one_line(error)}{extra}{error.hint}", file=stream, flush=True)
    for line in error.report:
        print(f"train.py: {line}", file=stream, flush=True)
    error.printed = True
