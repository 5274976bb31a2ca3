"""Who hung: when a collective times out or a rank is lost, the rank that saw it asks every rank through the
rendezvous store where it is (a thread per rank that sleeps in the store until asked: nothing per step), and names
the ranks that did not arrive, each rank's step and stage, and where the live ones are in the project's and the
user's code; every thread's stack of every rank goes to a file in the run's folder (docs/reliability.md, "Who
hung"). A rank that cannot answer (stopped, dead) is named with the last decision point every rank passed."""

import atexit
import contextlib
import faulthandler
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from fashion_mnist_dp.exit_codes import ExitCode
from fashion_mnist_dp.runtime.lifetime import kernel, running

ANSWER_WAIT_S = 10.0  # how long the reporting rank waits for the others' answers (a live rank takes milliseconds)
CONNECT_S = 30.0  # a rank's watch connecting at set-up; the reporting rank, whose store was up, waits ANSWER_WAIT_S
SHOWN_FRAMES = 2  # of a rank's innermost frames in the project's and the user's code, on its report line
_LIBRARIES = tuple(sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib"))
PROJECT = str(Path(__file__).resolve().parents[2])
_WAITING = (f"torch{os.sep}distributed{os.sep}", f"torch{os.sep}autograd{os.sep}")  # a rank in a collective is here
STACK_DUMP = signal.SIGRTMIN + 2  # a data worker writes its threads' stacks (faulthandler) to its file on this
WORKER_DUMPS = "FASHION_MNIST_WORKER_DUMPS"  # the folder of those files: the rank's own (worker_dumps)
_dumps: Optional[str] = None
STAGES = {"train": "training step", "sanity_check": "validation sanity check", "validate": "validation",
          "test": "test", "predict": "predict"}


def store(environ: Mapping[str, str] = os.environ, connect_s: float = CONNECT_S) -> Optional[torch.distributed.Store]:
    """A client of the job's rendezvous store (MASTER_ADDR:MASTER_PORT, Lightning's or torchrun's), under a prefix of
    this attempt (torchrun's store outlives a restart); None when it cannot be reached within ``connect_s``."""
    host, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    if not host or not port.isdigit() or not torch.distributed.is_initialized():
        return None
    try:
        client = torch.distributed.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=connect_s))
    except (RuntimeError, ValueError, OSError):
        return None
    return torch.distributed.PrefixStore(f"fashion_mnist_dp/hang/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/",
                                         client)


def _short(path: str) -> str:
    """A frame's file: below the project's folder or a library's, relative to it; else as it is."""
    for root in sorted({*_LIBRARIES, PROJECT}, key=len, reverse=True):  # the innermost first: a virtualenv in the
        # project is a library's, its site-packages inside its own lib/
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return path


def shown(frames: Sequence[traceback.FrameSummary]) -> List[str]:
    """``file:line function`` of the innermost frames in the project's and the user's code (outside Python's and the
    installed libraries'), innermost first; none there: the innermost frame of all."""
    ours = [f for f in frames if not f.filename.startswith(_LIBRARIES) and not f.filename.startswith("<")
            and f.filename != __file__] or list(frames[-1:])
    return [f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(ours[-SHOWN_FRAMES:])]


def position(trainer, frames: Sequence[traceback.FrameSummary]) -> str:
    """``optimizer step 30 (training step)``: the step and the stage of a rank, from its trainer and its stack."""
    names = {f.name for f in frames}
    if "save_checkpoint" in names:
        stage = "checkpoint save"
    elif names & {"setup_environment", "_call_setup_hook", "_call_configure_model", "_restore_modules_and_callbacks",
                  "setup"}:
        stage = "set-up"
    else:
        stage = STAGES.get(str(getattr(trainer.state.stage, "value", "")), "set-up")
    return f"optimizer step {trainer.global_step} ({stage})"


def answer(trainer, rank: int, frames: Optional[Sequence[traceback.FrameSummary]] = None, waited: bool = False
           ) -> Dict:
    """This rank's answer: where its main thread is (``frames``: where it saw the fault, its traceback, instead),
    whether it waits in a collective, and every thread's stack."""
    current, main = sys._current_frames(), threading.main_thread().ident
    stacks = ""
    if frames is None:
        frames = traceback.extract_stack(current[main]) if main in current else []
        waited = any(part in f.filename for f in frames for part in _WAITING)
    else:
        stacks = "Where it saw the fault (the traceback, innermost last):\n" + "".join(traceback.format_list(frames))
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    stacks += "".join(f"Thread {names.get(ident, ident)} (most recent call last):\n"
                      + "".join(traceback.format_stack(frame)) for ident, frame in current.items()
                      if ident != main or stacks == "")
    return {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "at": position(trainer, frames),
            "where": shown(frames), "waited": waited, "stacks": stacks}


class Watch:
    """One rank's side: a daemon thread blocked in the store until a report is asked for, then its answer."""

    def __init__(self, trainer) -> None:
        self.trainer, self.rank = trainer, trainer.global_rank
        threading.Thread(target=self._wait, name="hang-report", daemon=True).start()

    def _wait(self) -> None:
        client = store()
        if client is None:
            return
        try:
            client.set(f"pid{self.rank}", json.dumps([kernel(), os.getpid()]))  # the reporter sees if it ended
            client.wait(["ask"], timedelta(days=365))
            if client.check([f"rank{self.rank}"]):  # it saw the fault itself: it reports or ends on its own
                return
            client.set(f"rank{self.rank}", json.dumps(answer(self.trainer, self.rank)))
            client.wait(["end"], timedelta(seconds=ANSWER_WAIT_S + CONNECT_S))
        except (RuntimeError, ValueError):  # the job ended: the store's host is gone
            return
        # The job ends with the report: a rank stuck in Python would wait for nothing (and torchrun's agent gives a
        # rank that ignores its SIGTERM 30 s more)
        by = json.loads(client.get("ask"))["by"]
        print(f"train.py: rank {self.rank}: stopped: rank {by} found the job hung (its hang report says where each "
              f"rank was)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(int(ExitCode.TEMPFAIL))


def report(trainer, error: BaseException, world: int, last_point: Optional[str], folder: Optional[str],
           exited: Mapping[int, int] = {}) -> List[str]:
    """The rank that saw ``error`` (a collective timed out, a peer lost): its lines after its own, and the stacks'
    file in ``folder``; [] when another rank reports. ``last_point``: the last decision point every rank passed;
    ``exited``: exit codes of ranks this process launched that have ended."""
    frames = traceback.extract_tb(error.__traceback__)
    own = answer(trainer, trainer.global_rank, frames, waited=True)
    client, answers = store(connect_s=ANSWER_WAIT_S), {trainer.global_rank: own}
    ends = {rank: ended(code) for rank, code in exited.items()}  # how the ranks known to have ended did
    if client is not None:
        try:
            client.set(f"rank{trainer.global_rank}", json.dumps(own))
            if client.add("reporters", 1) > 1:
                return []  # the first rank that saw a fault reports
            client.set("ask", json.dumps({"by": trainer.global_rank}))
            waiting = [rank for rank in range(world) if rank not in ends]
            # the pids of the ranks on this kernel and in this pid namespace, as their watches told the store
            told, mine = {r: json.loads(client.get(f"pid{r}")) for r in waiting if client.check([f"pid{r}"])}, kernel()
            here = {rank: pid for rank, (where, pid) in told.items() if mine is not None and where == mine}
            deadline = time.monotonic() + ANSWER_WAIT_S
            while waiting and time.monotonic() < deadline:  # a rank whose process ended cannot answer
                ends.update({rank: f"did not answer (its process, pid {here[rank]} on this host, has ended)"
                             for rank in waiting if rank in here and not running(here[rank])})
                waiting = [rank for rank in waiting if rank not in ends and not client.check([f"rank{rank}"])]
                time.sleep(0.1 if waiting else 0)
            answers.update({r: json.loads(client.get(f"rank{r}")) for r in range(world) if client.check([f"rank{r}"])})
        except (RuntimeError, ValueError):
            pass  # the store's host stopped or died: what this rank knows itself
    global _asked
    _asked = client  # end_others() once this rank's lines are out
    lines = []
    for rank in range(world):
        found = answers.get(rank)
        if found is None:
            how = ends.get(rank, "did not answer (stopped, dead, or stuck outside Python)")
            lines.append(f"rank {rank} {how}: the last decision point every rank passed was {last_point or 'none'}")
            continue
        where = f", in {', '.join(found['where'])}" if found["where"] else ""
        verb = "timed out waiting" if rank == trainer.global_rank else "waited in a collective" if found["waited"] \
            else "did not arrive"
        lines.append(f"rank {rank} {verb}: at {found['at']}{where}")
    stacks = [(f"rank {rank} (host {found['host']}, pid {found['pid']}): {found['at']}", found["stacks"])
              for rank, found in sorted(answers.items())]
    return with_stacks(folder, trainer.global_rank, stacks, lines, "every thread's stack of every rank that answered")


_asked: Optional[torch.distributed.Store] = None  # the store this rank asked the others through


def end_others() -> None:
    """After the reporting rank's lines: the ranks that answered end now (the job is over)."""
    global _asked
    if _asked is not None:
        with contextlib.suppress(RuntimeError, ValueError):
            _asked.set("end", "1")
        _asked = None


def ended(code: int) -> str:
    """How a launched rank ended, from its exit code (negative: the signal that killed it)."""
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def join_report(world: int, came: int, exited: Mapping[int, int], running: Sequence[int]) -> List[str]:
    """Rank 0 of a rendezvous that timed out: which ranks it launched never joined, and why, where it knows."""
    lines = [f"rank {rank} {ended(code)} before it joined" for rank, code in sorted(exited.items())]
    lines += [f"rank {rank} is running but did not join (still starting, or stuck before the rendezvous)"
              for rank in running]
    if not lines and came == 1:
        missing = "rank 1" if world == 2 else f"ranks 1 to {world - 1}"
        lines = [f"only this rank joined; {missing} never reached MASTER_ADDR:MASTER_PORT"]
    return [f"hang report: {line}" for line in lines]


def with_stacks(folder: Optional[str], rank: int, stacks: Sequence[Tuple[str, str]], lines: Sequence[str],
                what: str) -> List[str]:
    """The report's lines; the report and each (title, stacks) written as ``hang-<UTC time>-rank<rank>.txt`` in
    ``folder`` (two ranks may report in one second), and a last line ``what: <file>``, where it can be."""
    if folder:
        path = Path(folder) / time.strftime(f"hang-%Y%m%d-%H%M%S-rank{rank}.txt", time.gmtime())
        with contextlib.suppress(OSError):
            path.write_text("\n".join(lines) + "\n" + "".join(f"\n=== {title}\n{text}" for title, text in stacks))
            lines = [*lines, f"{what}: {path}"]
    return [f"hang report: {line}" for line in lines]


def worker_dumps() -> None:
    """Before a rank starts its data workers: a folder of its own for their stacks (``mkdtemp``: a name no other
    process or user on the host has), told to them in the environment whatever their start method, and removed with
    what is in it when the rank exits."""
    global _dumps
    if _dumps is None:
        _dumps = tempfile.mkdtemp(prefix="fashion-mnist-workers-")
        atexit.register(shutil.rmtree, _dumps, ignore_errors=True)
    os.environ[WORKER_DUMPS] = _dumps


def _worker_file(pid: int) -> Optional[Path]:
    """A worker's stack file in its rank's folder; None where the rank made none."""
    folder = os.environ.get(WORKER_DUMPS)
    return Path(folder) / f"{pid}.stack" if folder else None


def dump_on_signal() -> None:
    """In a data worker (``worker_init_fn``): on :data:`STACK_DUMP`, its threads' stacks go to its file in its rank's
    folder; nothing where the rank made none (no JobFaults to read them) or it is gone."""
    path = _worker_file(os.getpid())
    if path is None:
        return
    try:
        handle = open(path, "w")  # open while the worker lives: faulthandler writes from C
    except OSError:  # the folder is gone: a variable left from a process that ended
        return
    faulthandler.register(STACK_DUMP, file=handle, all_threads=True, chain=False)


def worker_report(rank: int, folder: Optional[str], wait_s: float = 2.0) -> List[str]:
    """A rank whose data worker delivered no batch: where each of its workers is, from their own dumps."""
    workers = multiprocessing.active_children()
    for worker in workers:
        with contextlib.suppress(OSError):
            os.kill(worker.pid, STACK_DUMP)
    dumps, deadline = {}, time.monotonic() + wait_s
    while len(dumps) < len(workers) and time.monotonic() < deadline:
        for worker in workers:
            path = _worker_file(worker.pid)
            if worker.pid not in dumps and path and path.is_file() and path.stat().st_size:
                time.sleep(0.05)  # faulthandler writes the whole dump at once; let it finish
                dumps[worker.pid] = path.read_text(errors="replace")
        time.sleep(0.05)
    lines = []
    for worker in workers:
        text = dumps.get(worker.pid)
        main = next((block for block in (text or "").split("\n\n") if block.startswith("Current thread")), "")
        frames = [traceback.FrameSummary(file, int(line), name)  # the thread that took the signal: the main one
                  for file, line, name in re.findall(r'File "(.+)", line (\d+) in (\S+)', main)][::-1]
        loop = next((i for i, f in enumerate(frames) if f.name == "_worker_loop"), -1)  # what it runs is inside it
        inside = frames[loop + 1:] if loop >= 0 else frames
        where = ("did not answer" if not text else f"in {', '.join(shown(inside))}" if shown(inside)
                 else "idle, waiting for work in torch's worker loop")
        lines.append(f"rank {rank}'s data worker (pid {worker.pid}) is {where}")
    for path in filter(None, map(_worker_file, (worker.pid for worker in workers))):
        path.unlink(missing_ok=True)
    host = socket.gethostname()
    stacks = [(f"rank {rank}'s data worker (host {host}, pid {pid})", text) for pid, text in dumps.items()]
    return with_stacks(folder, rank, stacks, lines, "every thread's stack of its data workers")


TRACE_ENTRIES = 2000  # collectives each rank's NCCL flight recorder keeps (a ring buffer)


def flight_recorder(folder: Path, environ=os.environ) -> str:
    """NCCL's flight recorder on, unless set otherwise: a bounded ring of the last collectives of each rank, dumped
    on a timeout into ``folder`` (both names torch has used for each variable); the start block's line."""
    for name in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"):
        environ.setdefault(name, str(TRACE_ENTRIES))
    environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    for name in ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"):
        environ.setdefault(name, str(Path(folder).absolute() / "nccl-trace-rank"))
    prefix = Path(environ["TORCH_FR_DUMP_TEMP_FILE"])
    return (f"  flight recorder : NCCL's, {environ['TORCH_FR_BUFFER_SIZE']} collectives a rank, dumped on a timeout to "
            f"{prefix}<rank> (python -m torch.distributed.flight_recorder.fr_trace {prefix.parent} --prefix "
            f"{prefix.name})")
