"""Faults of the job, not of the training: a rank stuck or lost, a peer that never joined, a busy MASTER_PORT, a
stalled data worker. Each ends the rank that sees it with one line and exit 75 (rerun; ``--ckpt_path last`` resumes).

torch reports them as ``RuntimeError`` (gloo's timeouts and lost connections, the DataLoader's
timeout) or its ``DistError`` subclasses; :func:`describe_fault` recognises their messages (torch 2.x,
gloo). :class:`JobFaults` keeps the checkpoint-on-exception callbacks from starting a collective with a
rank that is gone (docs/reliability.md).
"""

import re
from typing import Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

from fashion_mnist_dp.runtime import compat
from fashion_mnist_dp.runtime.lifetime import configured_timeout, kill_data_workers, kill_stuck_workers_at_exit


def _seconds(text: str, pattern: str, scale: float = 1.0) -> Optional[str]:
    match = re.search(pattern, text)
    return f"{float(match.group(1)) * scale:g}" if match else None


def _configured_timeout() -> str:
    try:
        return f"{configured_timeout().total_seconds():g}"
    except ValueError:
        return "?"


def describe_fault(error: BaseException, rank: Optional[int] = None) -> Optional[str]:
    """The one line (without ``train.py: error:``) for a fault of the job, or None for any other exception."""
    if not isinstance(error, RuntimeError):
        return None
    text = " ".join(str(error).split())
    who = f"rank {rank}" if rank is not None else "this rank"
    timeout = _configured_timeout()
    if is_data_stall(error):
        waited = _seconds(text, r"DataLoader timed out after ([0-9.]+) seconds") or "?"
        return (f"{who}: a data loader worker delivered no batch for {waited} s (the worker stalled: stuck reading, "
                f"or deadlocked); --data.num_workers 0 (the default) loads in the rank itself; if a batch can "
                f"legitimately take that long, raise --data.worker_timeout (below --collective_timeout, now "
                f"{timeout} s)")
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        port = re.search(r"port: (\d+)", text)
        where = f"MASTER_PORT {port.group(1)}" if port else "MASTER_PORT"
        return (f"{who}: {where} is already in use on this machine (another job, or a process left from one, "
                f"listens on it): unset MASTER_PORT to let train.py pick a free port, or set a free one")
    joined = re.search(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined", text)
    if joined:
        waited, came, world = joined.groups()
        return (f"{who} waited {waited} s for the other ranks to join, and only {came} of {world} did: start every "
                f"rank (same MASTER_ADDR, MASTER_PORT and WORLD_SIZE) within collective_timeout (now {timeout} s) of "
                f"each other, and check that they can reach MASTER_ADDR:MASTER_PORT")
    unreachable = re.search(r"client socket has timed out after (\d+)ms while trying to connect to \(([^,]+), (\d+)\)",
                            text)
    if unreachable:
        waited = f"{int(unreachable.group(1)) / 1000:g}"
        return (f"{who} could not reach rank 0 at {unreachable.group(2)}:{unreachable.group(3)} within {waited} s: "
                f"start rank 0 too, with the same MASTER_ADDR and MASTER_PORT, and check that this machine can "
                f"reach that address")
    if re.search(r"Timed out waiting \d+ms for (recv|send) operation", text) or \
            "Watchdog caught collective operation timeout" in text:
        waited = _seconds(text, r"(?:Timed out waiting |Timeout\(ms\)=)(\d+)", 1e-3) or timeout
        return (f"{who} timed out after {waited} s waiting for the other ranks in a collective (a rank is stuck or "
                f"was lost; their output says which); resume with --ckpt_path last, or raise "
                f"--collective_timeout (now {timeout} s) if a step or a checkpoint save can legitimately take longer")
    if any(lost in text for lost in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")):
        return (f"{who} lost its connection to another rank in a collective (that rank exited or was killed: its "
                f"own output says why); resume with --ckpt_path last")
    return None


def is_data_stall(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and "DataLoader timed out after" in str(error)


def no_checkpoint_on_exception(trainer: Trainer) -> None:
    """Switch off the checkpoint-on-exception callbacks for the exception being handled (this trainer only)."""
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and getattr(callback, "save_on_exception", False):
            callback.save_on_exception = False
        elif isinstance(callback, OnExceptionCheckpoint):
            callback.on_exception = lambda *args, **kwargs: None  # this instance only


class JobFaults(Callback):
    """On a fault of the job: no collective save on exception, stuck data workers killed, and the launching process
    stops watching its ranks (it waits for them after its line). configs/default.yaml lists it first."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Data workers that stall get SIGKILLed at exit (multiprocessing would wait forever for one)."""
        if getattr(trainer.datamodule, "num_workers", 0):
            kill_stuck_workers_at_exit()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if describe_fault(exception) is None:
            return
        if is_data_stall(exception):
            kill_data_workers()  # else Lightning's teardown waits for the stuck worker (5 s per loader)
        if trainer.world_size > 1:
            no_checkpoint_on_exception(trainer)
        children = compat.release_children(trainer)
        if children:
            try:
                exception.children = children  # runtime.errors.reported ends them after the line
            except AttributeError:
                pass
