"""Checkpoints that are written atomically, carry a sha256, and are verified before they are loaded."""

from checkpointing.verified_io import (
    CheckpointCorruptError,
    CheckpointWriteError,
    VerifiedCheckpointIO,
    newest_valid,
    sidecar_path,
    verify,
)

__all__ = ["CheckpointCorruptError", "CheckpointWriteError", "VerifiedCheckpointIO", "newest_valid", "sidecar_path",
           "verify"]
