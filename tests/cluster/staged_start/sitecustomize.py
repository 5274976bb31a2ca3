"""On PYTHONPATH for a test under srun: puts task 1 at a known point of its start when task 0 fails, and records it
in ``$STAGED_START_RECORD``.

``STAGED_START=importing``: task 1 takes 30 s longer to import Lightning (as on a slow shared file system), so it is
still starting up when another task fails; it writes ``importing`` when the slow import starts and ``imported`` when
it is over: a task ended during its import leaves only the first.

``STAGED_START=waiting``: task 1 writes ``listening`` once train.py's signal handlers are installed (a thread watches
for them), and task 0 does not import Lightning before that file exists (at most 120 s): however loaded the machine,
task 1 is past its imports when task 0 fails.
"""

import os
import signal
import sys
import threading
import time
from pathlib import Path

SECONDS = 30
MODE = os.environ.get("STAGED_START")
RECORD = Path(os.environ.get("STAGED_START_RECORD", "."))
TASK = os.environ.get("SLURM_PROCID")


def _handlers_installed() -> bool:
    return getattr(signal.getsignal(signal.SIGUSR2), "__name__", "") == "on_peer_failed"


def _record_when_listening() -> None:
    while not _handlers_installed():
        time.sleep(0.02)
    (RECORD / "listening").touch()


class _StagedLightning:
    def find_spec(self, name, path=None, target=None):
        if name == "lightning" and MODE == "importing" and TASK == "1":
            (RECORD / "importing").touch()
            time.sleep(SECONDS)
            (RECORD / "imported").touch()
        if name == "lightning" and MODE == "waiting" and TASK == "0":
            deadline = time.monotonic() + 120
            while not (RECORD / "listening").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return None  # the normal finders import it


if MODE == "waiting" and TASK == "1":
    threading.Thread(target=_record_when_listening, daemon=True).start()
sys.meta_path.insert(0, _StagedLightning())
