"""Exit codes, and the one line a user sees instead of a traceback when the mistake is theirs."""

from enum import IntEnum


class ExitCode(IntEnum):
    """One code per failure class (sysexits.h numbering where one fits)."""

    OK = 0
    USAGE = 2  # bad flag, value, key or config file
    DATA = 65  # data files missing, unreadable or damaged (EX_DATAERR)
    CHECKPOINT = 66  # the checkpoint to load does not exist (EX_NOINPUT)
    DIVERGED = 70  # non-finite loss/gradient/weights, or accuracy at chance after warm-up (EX_SOFTWARE)
    CANT_CREATE = 73  # an output folder (logs, checkpoints) cannot be created or written (EX_CANTCREAT)


class CheckpointNotFoundError(FileNotFoundError):
    """``--ckpt_path`` names a file that is not there."""


class OutputNotWritableError(OSError):
    """A folder the run must write to (logs, checkpoints) is a file, or not writable."""


class ConfigError(ValueError):
    """A configuration that parses but cannot run (unknown strategy, impossible combination...)."""


def one_line(error: BaseException) -> str:
    """The error's message on one line: multi-line messages from jsonargparse or Lightning are folded."""
    return " ".join(str(error).split())
