"""On PYTHONPATH for a test under srun: puts task 1 at a known point of its start when task 0 fails, and records it
in ``$STAGED_START_RECORD``. Each point is reached by waiting for the other task's state, never for a time, so the
order holds however loaded the machine is.

``STAGED_START=importing``: task 1 stops in its import of Lightning (as on a slow shared file system) and stays
there until a signal ends it; it writes ``importing`` when it stops there, and ``imported`` if it ever goes on. Task 0
does not import Lightning before ``importing`` exists: task 0's failure, and the signal it sends the step, always
find task 1 importing, and a task ended during its import leaves only ``importing``.

``STAGED_START=waiting``: task 1 writes ``listening`` once train.py's signal handlers are installed (a thread watches
for them), and task 0 does not import Lightning before that file exists: task 1 is past its imports when task 0
fails.

Task 0 writes ``task0-exited`` at its exit (an atexit handler: after its line and its signal to the step), so a test
can time the step's end from task 0's failure rather than from the start, which load stretches.

Each wait gives up after :data:`SAFETY_S`, a safety net far beyond any start-up: a stage that never comes then shows
as a missing or extra record, not as a job that never ends.
"""

import atexit
import os
import signal
import sys
import threading
import time
from pathlib import Path

SAFETY_S = 120
MODE = os.environ.get("STAGED_START")
RECORD = Path(os.environ.get("STAGED_START_RECORD", "."))
TASK = os.environ.get("SLURM_PROCID")


def _handlers_installed() -> bool:
    return getattr(signal.getsignal(signal.SIGUSR2), "__name__", "") == "on_peer_failed"


def _record_when_listening() -> None:
    while not _handlers_installed():
        time.sleep(0.02)
    (RECORD / "listening").touch()


def _wait_for(name: str) -> None:
    deadline = time.monotonic() + SAFETY_S
    while not (RECORD / name).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class _StagedLightning:
    def __init__(self) -> None:
        self.staged = False

    def find_spec(self, name, path=None, target=None):
        if name != "lightning" or self.staged:
            return None
        self.staged = True
        if MODE == "importing" and TASK == "1":
            (RECORD / "importing").touch()
            _wait_for("never")  # the peer's signal ends the process here (train.py's first lines)
            (RECORD / "imported").touch()
        if TASK == "0" and MODE in ("importing", "waiting"):
            _wait_for("importing" if MODE == "importing" else "listening")
        return None  # the normal finders import it


if MODE == "waiting" and TASK == "1":
    threading.Thread(target=_record_when_listening, daemon=True).start()
if MODE in ("importing", "waiting") and TASK == "0":
    atexit.register(lambda: (RECORD / "task0-exited").touch())
sys.meta_path.insert(0, _StagedLightning())
