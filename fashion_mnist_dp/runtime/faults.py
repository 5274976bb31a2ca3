"""Faults of the job (a rank stuck or lost, a peer that never joined, a busy port, a stalled data worker): one line
and exit 75 from torch's messages; docs/reliability.md, "No hang"."""

import re
from typing import Optional

from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.owner import each

from fashion_mnist_dp.runtime import compat, hangs
from fashion_mnist_dp.runtime.errors import one_line
from fashion_mnist_dp.runtime.lifetime import configured_timeout, kill_data_workers, kill_data_workers_at_exit


BUSY = (" is already in use on this machine (another job, or a process left from one, listens on it): unset "
        "MASTER_PORT to let train.py pick a free port, or set a free one")
STALLED = r"DataLoader timed out after (?P<waited>[0-9.]+) seconds"
JOINED = r"Timed out after (?P<waited>\d+) seconds waiting for clients\. (?P<came>\d+)/(?P<world>\d+) clients joined"
STUCK = (r"Timed out waiting (?P<waited_ms>\d+)ms for (?:recv|send) operation|Watchdog caught collective operation "
         r"timeout(?:.*?Timeout\(ms\)=(?P<watchdog_ms>\d+))?")
LOST = r"Connection closed by peer|Connection reset by peer|Broken pipe"
# What torch says (a regex: named groups; ``_ms`` groups are milliseconds, shown in seconds) and the line it gets
# (with ``who`` and ``timeout``, the collective timeout; ``waited`` is the timeout unless torch says), in this order.
FAULTS = (
    (STALLED,
     "{who}: a data loader worker delivered no batch for {waited} s (the worker stalled: stuck reading, or "
     "deadlocked); --data.num_workers 0 (the default) loads in the rank itself; if a batch can legitimately take that "
     "long, raise --data.worker_timeout (below --collective_timeout, now {timeout} s)"),
    (r"(?i)port: (?P<port>\d+).*(?:EADDRINUSE|address already in use)", "{who}: MASTER_PORT {port}" + BUSY),
    (r"(?i)EADDRINUSE|address already in use", "{who}: MASTER_PORT" + BUSY),
    (JOINED,
     "{who} waited {waited} s for the other ranks to join, and only {came} of {world} did: start every rank (same "
     "MASTER_ADDR, MASTER_PORT and WORLD_SIZE) within collective_timeout (now {timeout} s) of each other, and check "
     "that they can reach MASTER_ADDR:MASTER_PORT"),
    (r"client socket has timed out after (?P<waited_ms>\d+)ms while trying to connect to \((?P<host>[^,]+), "
     r"(?P<port>\d+)\)",
     "{who} could not reach rank 0 at {host}:{port} within {waited} s: start rank 0 too, with the same MASTER_ADDR "
     "and MASTER_PORT, and check that this machine can reach that address"),
    (STUCK,
     "{who} timed out after {waited} s waiting for the other ranks in a collective (a rank is stuck or was lost: the "
     "hang report below says which, and where); resume with --ckpt_path last, or raise --collective_timeout (now "
     "{timeout} s) if a step or a checkpoint save can legitimately take longer"),
    (r"Gloo connectFullMesh failed with (?P<detail>.{0,160})",
     "{who} could not connect to the other ranks (gloo: {detail}): across hosts, set GLOO_SOCKET_IFNAME (for NCCL, "
     "NCCL_SOCKET_IFNAME) to the network interface that reaches the other nodes, e.g. eth1: where the host name "
     "resolves to a loopback address, gloo offers its peers 127.0.0.1 (docs/running-on-clusters.md)"),
    (LOST,
     "{who} lost its connection to another rank in a collective (that rank exited or was killed: its own output says "
     "why); resume with --ckpt_path last"),
)


def fault_of(error: BaseException) -> Optional[str]:
    """Which of :data:`FAULTS` ``error`` is (its pattern: the first that matches), or None."""
    text = one_line(error) if isinstance(error, RuntimeError) else ""
    return next((pattern for pattern, _ in FAULTS if re.search(pattern, text)), None)


def describe_fault(error: BaseException, rank: Optional[int] = None) -> Optional[str]:
    """The one line (without ``train.py: error:``) for a fault of the job, or None for any other exception."""
    pattern = fault_of(error)
    if pattern is None:
        return None
    configured = configured_timeout()
    timeout = f"{configured.total_seconds():g}" if configured else "?"
    values = {"waited": timeout}
    for name, value in re.search(pattern, one_line(error)).groupdict().items():
        if value and name.endswith("_ms"):
            values["waited"] = f"{int(value) / 1000:g}"
        elif value:
            values[name] = f"{float(value):g}" if name == "waited" else value
    return dict(FAULTS)[pattern].format(who=f"rank {rank}" if rank is not None else "this rank", timeout=timeout,
                                        **values)


class JobFaults(Callback):
    """On a fault of the job: who hung (the hang report), no collective save, stuck data workers killed, the launcher
    waits for its ranks."""

    def __init__(self) -> None:
        self.folder: Optional[str] = None  # the run's, for the hang report's stacks

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if getattr(trainer.datamodule, "num_workers", 0):
            hangs.worker_dumps()  # where its workers' stacks go, for the report on a stalled one
            kill_data_workers_at_exit()
        if trainer.world_size > 1:
            self.folder = trainer.log_dir  # a collective: every rank is in setup
            hangs.Watch(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        fault = fault_of(exception)  # the report is about the fault that the rank's line names
        if fault is None:
            return
        if fault == STALLED:  # a data worker that delivered no batch
            exception.report = hangs.worker_report(trainer.global_rank, self.folder)
            kill_data_workers()  # else Lightning's teardown waits for the stuck worker (5 s per loader)
        elif trainer.world_size > 1:
            children = compat.launched_children(trainer)  # Lightning's launcher: local ranks 1, 2... of this node
            codes = {trainer.global_rank + i: p.poll() for i, p in enumerate(children, 1)}
            exited = {rank: code for rank, code in codes.items() if code is not None}
            if fault in (STUCK, LOST):
                agreement = next((c for c in each(trainer.callbacks) if hasattr(c, "last_point")), None)
                exception.report = hangs.report(trainer, exception, trainer.world_size,
                                                getattr(agreement, "last_point", None), self.folder, exited)
            elif fault == JOINED:
                joined = re.search(JOINED, one_line(exception))
                exception.report = hangs.join_report(trainer.world_size, int(joined["came"]), exited,
                                                     [rank for rank, code in codes.items() if code is None])
        if trainer.world_size > 1:
            compat.no_checkpoint_on_exception(trainer)
        exception.children = compat.launched_children(trainer, release=True)  # cli/failures.py ends them after the line
