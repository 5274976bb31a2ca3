"""Exit codes, and the one line a user sees instead of a traceback when the mistake is theirs."""

from enum import IntEnum


class ExitCode(IntEnum):
    """One code per failure class (sysexits.h numbering where one fits)."""

    OK = 0
    USAGE = 2  # bad flag, value, key or config file
    DATA = 65  # data files missing, unreadable or damaged (EX_DATAERR)
    CHECKPOINT = 66  # the checkpoint to load does not exist or is damaged (EX_NOINPUT)
    DIVERGED = 70  # non-finite loss/gradient/weights, or accuracy at chance after warm-up (EX_SOFTWARE)
    CANT_CREATE = 73  # an output folder or a checkpoint cannot be created or written (EX_CANTCREAT)
    TEMPFAIL = 75  # a rank lost or stuck, a peer that never joined, a busy MASTER_PORT, a stalled data worker (EX_TEMPFAIL)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); during training after saving a verified last.ckpt
    PREEMPTED = 143  # SIGTERM or SLURM's SIGUSR1 (128 + SIGTERM), after saving a verified last.ckpt


class CheckpointNotFoundError(FileNotFoundError):
    """``--ckpt_path`` names a file that is not there."""


class OutputNotWritableError(OSError):
    """A folder the run must write to (logs, checkpoints) is a file, or not writable."""


class ConfigError(ValueError):
    """A configuration that parses but cannot run (unknown strategy, impossible combination...)."""


def one_line(error: BaseException) -> str:
    """The error's message on one line: multi-line messages from jsonargparse or Lightning are folded."""
    return " ".join(str(error).split())
