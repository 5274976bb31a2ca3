"""The exit-code table (docs/cli.md), importing nothing heavy: train.py's first lines use it before the package."""

from enum import IntEnum


class ExitCode(IntEnum):
    """One code per failure class (sysexits.h numbering where one fits)."""

    OK = 0
    PEER_FAILED = 1  # under srun: another task of the step failed (srun returns the highest code: the failed one's)
    USAGE = 2  # bad flag, value, key or config file
    DATA = 65  # data files missing, unreadable or damaged (EX_DATAERR)
    CHECKPOINT = 66  # the checkpoint to load does not exist, is damaged, or is not a plain checkpoint (EX_NOINPUT)
    DIVERGED = 70  # non-finite loss/gradient/weights, or accuracy at chance after warm-up (EX_SOFTWARE)
    CANT_CREATE = 73  # an output folder or a checkpoint cannot be created or written (EX_CANTCREAT)
    TEMPFAIL = 75  # a rank lost or stuck, a peer that never joined, a busy MASTER_PORT, a stalled data worker
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    LAUNCHER_GONE = 137  # a launched rank whose launcher died before it started (128 + SIGKILL, as if killed)
    PREEMPTED = 143  # SIGTERM or SLURM's SIGUSR1 (128 + SIGTERM)
