"""Callbacks that tests add through the real CLI (``--trainer.callbacks+=tests.recorder.SampleRecorder``).

``SampleRecorder``: each rank writes which samples it trained and validated on, and the port of
its process group's store, to ``$SAMPLE_RECORD_DIR/rank<global rank>.json`` (also when the run stops
with an exception, e.g. a preemption).
``WeightsRecorder``: full weights before and after training, and what each rank held.
``PrepareDataRecorder``: every call of the data module's ``prepare_data`` in a process goes to
``$SAMPLE_RECORD_DIR/prepare_data-rank<r>.jsonl``.
"""

import json
import os
import signal
import time
from pathlib import Path

from lightning.pytorch import Callback
from torchvision.datasets import FashionMNIST

from datamodules import FashionMNISTDataModule
from datamodules.files import missing_files, raw_folder
from datamodules.in_memory import InMemoryImages
from tests.idx_files import sample_ids
from tests.mirror import served_resources


class SampleRecorder(Callback):
    def __init__(self) -> None:
        self.train = {}  # epoch -> ids
        self.val = []  # one list of ids per validation (twice an epoch by default)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train.setdefault(trainer.current_epoch, []).extend(sample_ids(batch[0]))

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.val.append([])

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.val[-1].extend(sample_ids(batch[0]))

    def on_fit_end(self, trainer, pl_module):
        self._write(trainer)

    def on_exception(self, trainer, pl_module, exception):
        self._write(trainer)

    def _write(self, trainer):
        out = Path(os.environ["SAMPLE_RECORD_DIR"]) / f"rank{trainer.global_rank}.json"
        environment = getattr(trainer.strategy, "cluster_environment", None)  # None: a single-device run
        port = environment.main_port if environment is not None else None
        out.write_text(json.dumps({"world_size": trainer.world_size, "main_port": port,
                                   "train": self.train, "val": self.val}))


class SlowValidation(Callback):
    """Makes every validation pass take at least ``seconds``: time the throughput figures must not count."""

    def __init__(self, seconds: float = 2.0) -> None:
        self.seconds = seconds

    def on_validation_epoch_end(self, trainer, pl_module):
        time.sleep(self.seconds)


class WeightsRecorder(Callback):
    """At the end of training, what ddp/fsdp equivalence and sharding tests compare.

    Rank 0 saves the full (gathered) weights before the first and after the last step
    to ``$SAMPLE_RECORD_DIR/initial.pt`` and ``weights.pt``; every rank writes
    ``shard<rank>.json``: the parameter and optimizer-state elements it holds itself,
    and the per-step training loss averaged over ranks.
    """

    def __init__(self) -> None:
        self.losses = []

    @staticmethod
    def _save_weights(trainer, name: str) -> None:
        import torch

        state = trainer.strategy.lightning_module_state_dict()  # a collective under fsdp
        if trainer.is_global_zero:
            torch.save({k: v.detach().cpu() for k, v in state.items()}, Path(os.environ["SAMPLE_RECORD_DIR"]) / name)

    def on_train_start(self, trainer, pl_module):
        self._save_weights(trainer, "initial.pt")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"].detach() if isinstance(outputs, dict) else outputs.detach()
        self.losses.append(float(trainer.strategy.reduce(loss, reduce_op="mean")))

    def on_train_end(self, trainer, pl_module):
        import torch

        from lightning_modules.optim import local_shard

        self._save_weights(trainer, "weights.pt")
        optimizer_state = sum(
            local_shard(value).numel()
            for per_param in trainer.optimizers[0].state.values()
            for value in per_param.values()
            if torch.is_tensor(value) and value.dim() > 0
        )
        record = {
            "parameters": sum(local_shard(p).numel() for p in pl_module.parameters()),
            "optimizer_state": optimizer_state,
            "losses": self.losses,
        }
        (Path(os.environ["SAMPLE_RECORD_DIR"]) / f"shard{trainer.global_rank}.json").write_text(json.dumps(record))


def _env_int(*names: str) -> int:
    """The first of ``names`` set in the environment (torchrun and Lightning's launcher set them), else 0."""
    return next((int(os.environ[n]) for n in names if n in os.environ), 0)


class PrepareDataRecorder(Callback):
    """Records, without changing it, every ``FashionMNISTDataModule.prepare_data`` call in this process.

    No Callback hook sees ``prepare_data``, and train.py calls it already in ``before_fit``
    (the CLI's pre-launch check) before Lightning calls it again inside ``fit``. So the
    constructor, which the CLI runs before either, wraps the method on the class. Each call
    appends one JSON line: ranks (the trainer's once attached, else the launcher's environment),
    which call site (``cli`` before fit, ``lightning:fit`` / ``lightning:test`` inside Lightning's
    fit and the test after it), the folder checked and the
    files it found missing there.
    """

    def __init__(self) -> None:
        original = FashionMNISTDataModule.prepare_data
        if getattr(original, "recorded_by", None) is PrepareDataRecorder:
            return  # already wrapped in this process

        def prepare_data(datamodule: FashionMNISTDataModule) -> None:
            trainer = datamodule.trainer
            if trainer is not None:
                ranks = {"global_rank": trainer.global_rank, "local_rank": trainer.local_rank,
                         "node_rank": trainer.node_rank}
            else:
                ranks = {"global_rank": _env_int("RANK"), "local_rank": _env_int("LOCAL_RANK"),
                         "node_rank": _env_int("GROUP_RANK", "NODE_RANK")}
            caller = f"lightning:{trainer.state.fn.value}" if trainer is not None else "cli"
            entry = dict(ranks, caller=caller, pid=os.getpid(),
                         raw_folder=str(raw_folder(datamodule.data_dir).resolve()),
                         missing=missing_files(datamodule.data_dir))
            out = Path(os.environ["SAMPLE_RECORD_DIR"]) / f"prepare_data-rank{ranks['global_rank']}.jsonl"
            with out.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            original(datamodule)

        prepare_data.recorded_by = PrepareDataRecorder
        FashionMNISTDataModule.prepare_data = prepare_data


class RankWeights(Callback):
    """ddp: every rank's own weights after training, and whether its gradients were already synced.

    At every ``on_before_optimizer_step`` (callbacks run before the LightningModule's hook, so before
    any gradient noise) the ranks' gradients are all-gathered and compared; each rank writes
    ``rank_weights<rank>.pt`` (its ``state_dict``) and ``rank_grads<rank>.json`` (one bool per step).
    """

    def __init__(self) -> None:
        self.grads_equal = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        import torch
        import torch.distributed as dist

        flat = torch.cat([p.grad.detach().flatten() for p in pl_module.parameters() if p.grad is not None])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        self.grads_equal.append(all(torch.equal(g, gathered[0]) for g in gathered))

    def on_train_end(self, trainer, pl_module):
        import torch

        record = Path(os.environ["SAMPLE_RECORD_DIR"])
        torch.save({k: v.detach().cpu() for k, v in pl_module.state_dict().items()},
                   record / f"rank_weights{trainer.global_rank}.pt")
        (record / f"rank_grads{trainer.global_rank}.json").write_text(json.dumps(self.grads_equal))


class NonFiniteGradient(Callback):
    """Fault injection: on global rank ``rank`` only, one gradient becomes nan just before optimizer step ``step``
    (1-based), after ddp has averaged the gradients, so that no other rank sees it."""

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step = step
        self.rank = rank

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_rank == self.rank and trainer.global_step + 1 == self.step:
            first = next(p for p in pl_module.parameters() if p.grad is not None)
            first.grad.view(-1)[0] = float("nan")


class SlowSteps(Callback):
    """Each training batch takes at least ``seconds``; from optimizer step ``mark_at`` on, rank 0 writes
    ``$SAMPLE_RECORD_DIR/step`` (the step number), so a test knows training is under way before it signals. In a
    SLURM job array: ``step-<task id>-<start>``, start 0 and then 1 for a requeued start.

    ``hold_s`` > 0: in the first start (not a requeued one), every rank stops at step ``mark_at`` until its process
    has received SIGINT, SIGTERM or SIGUSR1 (at most ``hold_s``), so a test's signal lands in training however long
    it takes to send; the ranks then stop at the next decision point."""

    def __init__(self, seconds: float = 0.2, mark_at: int = 1, hold_s: float = 0.0) -> None:
        self.seconds = seconds
        self.mark_at = mark_at
        self.hold_s = hold_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(self.seconds)
        if trainer.global_step < self.mark_at:
            return
        start = os.environ.get("SLURM_RESTART_COUNT", "0")
        if trainer.is_global_zero:
            task = os.environ.get("SLURM_ARRAY_TASK_ID")
            name = f"step-{task}-{start}" if task else "step"
            (Path(os.environ["SAMPLE_RECORD_DIR"]) / name).write_text(str(trainer.global_step))
        if self.hold_s > 0 and start == "0":
            from fashion_mnist_dp.runtime.signals import installed

            handlers, deadline = installed(), time.monotonic() + self.hold_s
            while handlers is not None and not any(handlers.received) and time.monotonic() < deadline:
                time.sleep(0.05)


class BreakCheckpointFolder(Callback):
    """When validation of epoch ``epoch`` (1-based) starts, before the checkpoint callbacks save at its end, the
    checkpoint folder becomes a file: every save after that fails (as on a full or read-only disk, even as root)."""

    def __init__(self, epoch: int = 2) -> None:
        self.epoch = epoch

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.current_epoch + 1 == self.epoch and trainer.is_global_zero:
            import shutil

            folder = Path(trainer.checkpoint_callback.dirpath)
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.write_text("not a folder")


class HangRank(Callback):
    """Global rank ``rank`` stops taking part at optimizer step ``step`` (sleeps), as a rank stuck in I/O would; with
    ``$SAMPLE_RECORD_DIR`` set it first writes ``hung`` there (when the hang began)."""

    def __init__(self, rank: int = 1, step: int = 6) -> None:
        self.rank = rank
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step >= self.step:
            if os.environ.get("SAMPLE_RECORD_DIR"):
                (Path(os.environ["SAMPLE_RECORD_DIR"]) / "hung").write_text(str(trainer.global_step))
            time.sleep(3600)


class SignalAt(Callback):
    """Fault injection: global rank ``rank`` sends itself ``signal`` (a name, default SIGTERM) just before optimizer
    step ``step`` runs, as a scheduler's preemption would; the ranks act on it at the next decision point
    (fashion_mnist_dp/runtime/agreement.py: step ``step`` itself with ``--check_every_n_steps 1``).

    With ``batch`` instead of ``step``: just before training batch ``batch`` (counted from 1 over the whole run),
    even one after which no optimizer step runs (``accumulate_grad_batches`` > 1)."""

    def __init__(self, step: int = 0, rank: int = 0, signal: str = "SIGTERM", batch: int = 0) -> None:
        self.step = step
        self.batch = batch
        self.rank = rank
        self.signal = signal
        self._sent = False

    def _send(self, trainer, now: bool) -> None:
        if trainer.global_rank == self.rank and now and not self._sent:
            self._sent = True
            os.kill(os.getpid(), getattr(signal, self.signal))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._send(trainer, self.step and trainer.global_step + 1 == self.step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._send(trainer, self.batch and trainer.fit_loop.epoch_loop.total_batch_idx + 1 == self.batch)


class CountCollectives(Callback):
    """Counts the collectives Python code runs (torch.distributed's all_reduce, broadcast, barrier, all_gather...)
    from one training batch's end to the next one's, within an epoch, a validation's own left out (a validation is a
    decision point: it agrees, and syncs its metrics); each rank writes the counts to
    ``$SAMPLE_RECORD_DIR/collectives<rank>.json`` after every batch. (ddp's gradient all-reduce is not counted: it
    is the training itself. It runs in C++, or, when the step-time breakdown times its buckets, as the asynchronous
    all_reduce of DDP's own allreduce hook: no collective of ours runs with ``async_op=True``.)"""

    NAMES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "all_gather_single",
             "all_gather_object",
             "broadcast_object_list", "reduce", "gather", "scatter", "reduce_scatter")

    def __init__(self) -> None:
        self.calls = self._before_validation = 0
        self.counts = []
        self._epoch = None

    def setup(self, trainer, pl_module, stage):
        import torch.distributed as dist

        for name in self.NAMES:
            original = getattr(dist, name, None)
            if original is None or getattr(original, "counted_by", None) is self:
                continue

            def counted(*args, _original=original, **kwargs):
                self.calls += 0 if kwargs.get("async_op") else 1
                return _original(*args, **kwargs)

            counted.counted_by = self
            setattr(dist, name, counted)

    def on_validation_start(self, trainer, pl_module):
        self._before_validation = self.calls

    def on_validation_end(self, trainer, pl_module):
        self.calls = self._before_validation

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._epoch == trainer.current_epoch:
            self.counts.append(self.calls)
        self._epoch, self.calls = trainer.current_epoch, 0
        out = Path(os.environ["SAMPLE_RECORD_DIR"]) / f"collectives{trainer.global_rank}.json"
        out.write_text(json.dumps(self.counts))


class _StallingImages(InMemoryImages):
    """A training split whose DataLoader worker stops delivering at its ``after``-th batch (sleeps for an hour)."""

    def __init__(self, split: InMemoryImages, after: int) -> None:
        self.images, self.targets = split.images, split.targets
        self.after = after
        self.served = 0  # in the worker process

    def __getitems__(self, indices):
        import torch.utils.data

        if torch.utils.data.get_worker_info() is not None:
            self.served += 1
            if self.served >= self.after:
                (Path(os.environ["SAMPLE_RECORD_DIR"]) / "stalled").write_text(str(os.getpid()))
                time.sleep(3600)
        return super().__getitems__(indices)


class StallDataWorker(Callback):
    """Fault injection: on global rank ``rank``, the training DataLoader's worker stalls at its ``after``-th batch
    (as a worker stuck on a hung file system would) and writes ``$SAMPLE_RECORD_DIR/stalled``. Needs
    ``--data.num_workers`` > 0; the worker is persistent, so batches count across epochs."""

    def __init__(self, rank: int = 1, after: int = 6) -> None:
        self.rank = rank
        self.after = after

    def setup(self, trainer, pl_module, stage):
        datamodule = trainer.datamodule  # its setup ran before the callbacks'
        if stage == "fit" and trainer.global_rank == self.rank and not isinstance(datamodule.train_set, _StallingImages):
            datamodule.train_set = _StallingImages(datamodule.train_set, self.after)


class KillAfterCheckpoint(Callback):
    """Fault injection for restarts: in each of the first ``attempts`` attempts, global rank ``rank`` SIGKILLs itself
    ``steps_after`` optimizer steps after the first epoch end this process saw (so after that epoch's checkpoint).

    The attempt is torchrun's ``TORCHELASTIC_RESTART_COUNT`` (0 outside torchrun); the marker file
    ``$SAMPLE_RECORD_DIR/killed-<attempt>`` is created first, so an attempt kills at most once even when the same
    command is started again by hand. Rank 0 records the step each attempt started training at in
    ``attempt-<attempt>.json``.
    """

    def __init__(self, rank: int = 1, steps_after: int = 2, attempts: int = 1) -> None:
        self.rank = rank
        self.steps_after = steps_after
        self.attempts = attempts
        self._kill_at = None

    @staticmethod
    def _attempt() -> int:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero:
            record = Path(os.environ["SAMPLE_RECORD_DIR"]) / f"attempt-{self._attempt()}.json"
            record.write_text(json.dumps({"start_step": trainer.global_step, "pid": os.getpid()}))

    def on_train_epoch_end(self, trainer, pl_module):
        if self._kill_at is None:
            self._kill_at = trainer.global_step + self.steps_after

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.global_rank != self.rank or self._kill_at is None or trainer.global_step < self._kill_at
                or self._attempt() >= self.attempts):
            return
        try:
            (Path(os.environ["SAMPLE_RECORD_DIR"]) / f"killed-{self._attempt()}").open("x").close()
        except FileExistsError:
            return
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


class StopStep(Callback):
    """Each rank writes the optimizer step it stopped at, and why, to ``$SAMPLE_RECORD_DIR/stop<global rank>.json``
    when the run ends with an exception (a preemption stop is one)."""

    def on_exception(self, trainer, pl_module, exception):
        record = Path(os.environ["SAMPLE_RECORD_DIR"]) / f"stop{trainer.global_rank}.json"
        record.write_text(json.dumps({"global_step": trainer.global_step, "exception": type(exception).__name__}))


class SigtermAt(Callback):
    """Fault injection for the order of a stop: at ``stage`` of the first stop after a SIGUSR1 (``before_save``,
    ``after_save``, ``after_requeue``, ``before_line``), rank 0 sends SIGTERM to every rank, as SLURM does to every
    task once ``scontrol requeue`` has run, then gives the signal 0.5 s to be handled there. Every rank writes its
    pid to ``$SAMPLE_RECORD_DIR/pid<global rank>``."""

    STAGES = ("before_save", "after_save", "after_requeue", "before_line")

    def __init__(self, stage: str = "after_requeue") -> None:
        if stage not in self.STAGES:
            raise ValueError(f"stage must be one of {self.STAGES}, not {stage!r}")
        self.stage = stage
        self._sent = False

    def setup(self, trainer, pl_module, stage):
        from fashion_mnist_dp.runtime import errors, signals

        self.record = Path(os.environ["SAMPLE_RECORD_DIR"])
        (self.record / f"pid{trainer.global_rank}").write_text(str(os.getpid()))
        if not trainer.is_global_zero:
            return
        save, requeue, print_line = trainer.save_checkpoint, signals.requeue, errors.print_line

        def save_checkpoint(*args, **kwargs):
            self._at("before_save")
            save(*args, **kwargs)
            self._at("after_save")

        def requeue_then_signal():
            outcome = requeue()
            self._at("after_requeue")
            return outcome

        def signal_then_print(error):
            self._at("before_line")
            print_line(error)

        trainer.save_checkpoint = save_checkpoint
        signals.requeue, errors.print_line = requeue_then_signal, signal_then_print

    def _at(self, stage: str) -> None:
        from fashion_mnist_dp.runtime.signals import SIGNALS, installed

        if stage != self.stage or self._sent or not installed().received[SIGNALS.index(signal.SIGUSR1)]:
            return
        self._sent = True
        for pid_file in sorted(self.record.glob("pid*")):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        time.sleep(0.5)


class AlignedStart(Callback):
    """The ranks leave ``on_train_start`` together (a barrier after the hooks of the callbacks listed before it).
    Rank 0's own start-up work there (the start block, the run's files) otherwise puts it 0.1-0.3 s behind or ahead
    of rank 1 at the first step, by an amount load changes, and the first step's wait holds that skew."""

    def on_train_start(self, trainer, pl_module):
        trainer.strategy.barrier("aligned_start")


class SlowRank(Callback):
    """Global rank ``rank`` spends ``seconds`` more in every training step, before its backward (as a slower device
    would): the other ranks wait for it in the gradient all-reduce."""

    def __init__(self, rank: int = 1, seconds: float = 0.1) -> None:
        self.rank, self.seconds = rank, seconds

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_rank == self.rank:
            time.sleep(self.seconds)


class SlowData(Callback):
    """Global rank ``rank``'s training loader takes ``seconds`` more per batch (its dataset's batch fetch sleeps)."""

    def __init__(self, rank: int = 1, seconds: float = 0.1) -> None:
        self.rank, self.seconds = rank, seconds

    def setup(self, trainer, pl_module, stage):
        if trainer.global_rank != self.rank:
            return
        dataset, seconds = trainer.datamodule.train_set, self.seconds
        fetch = dataset.__getitems__

        def slow_fetch(indices):
            time.sleep(seconds)
            return fetch(indices)

        dataset.__getitems__ = slow_fetch


class SlowAllReduce(Callback):
    """Every gradient all-reduce takes ``seconds`` more: DDP's allreduce hook, which callbacks/throughput.py times,
    replaced in this process by one whose future's callback sleeps on the first bucket, as a slow link would."""

    def __init__(self, seconds: float = 0.1) -> None:
        self.seconds = seconds

    def setup(self, trainer, pl_module, stage):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        seconds, allreduce_hook = self.seconds, default_hooks.allreduce_hook

        def slow_allreduce(state, bucket):
            future = allreduce_hook(state, bucket)
            if bucket.index() != 0:
                return future

            def sleep_then(done):
                time.sleep(seconds)
                return done.value()

            return future.then(sleep_then)

        default_hooks.allreduce_hook = slow_allreduce


class WhereRanksRun(Callback):
    """At the start of training each rank writes where it runs to ``$SAMPLE_RECORD_DIR/where<global rank>.json``:
    its pid, SLURM node, network namespace (the inode of ``/proc/<pid>/ns/net``), node and local rank, the
    rendezvous address its cluster environment gave and its GLOO_SOCKET_IFNAME (tests/cluster/test_two_nodes.py)."""

    def on_train_start(self, trainer, pl_module):
        environment = trainer.strategy.cluster_environment
        record = {"pid": os.getpid(), "node": os.environ.get("SLURMD_NODENAME"),
                  "net_ns": os.stat(f"/proc/{os.getpid()}/ns/net").st_ino, "node_rank": trainer.node_rank,
                  "local_rank": trainer.local_rank, "world_size": trainer.world_size,
                  "environment": type(environment).__name__, "main_address": environment.main_address,
                  "main_port": environment.main_port, "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
        (Path(os.environ["SAMPLE_RECORD_DIR"]) / f"where{trainer.global_rank}.json").write_text(json.dumps(record))


class ServedArchives(Callback):
    """torchvision's FashionMNIST in this process checks the MD5s of the test mirror's archives in ``folder`` (the
    tiny data's, not the real ones) and has no mirror of its own, so only ``--data.mirror`` is tried. The CLI builds
    callbacks before train.py's prepare_data downloads (tests/cluster/test_two_nodes.py)."""

    def __init__(self, folder: str) -> None:
        FashionMNIST.resources = served_resources(Path(folder))
        FashionMNIST.mirrors = []
