"""On PYTHONPATH for a test: under srun, task 1 takes 30 s longer to import Lightning (as on a slow shared file
system), so it is still starting up when another task fails. With ``$SLOW_IMPORT_RECORD``, it writes
``importing`` there when the slow import starts and ``imported`` when it is over: a task ended during its import
leaves only the first."""

import os
import sys
import time
from pathlib import Path

SECONDS = 30


class _SlowLightning:
    def find_spec(self, name, path=None, target=None):
        if name == "lightning" and os.environ.get("SLURM_PROCID") == "1":
            record = os.environ.get("SLOW_IMPORT_RECORD")
            if record:
                (Path(record) / "importing").touch()
            time.sleep(SECONDS)
            if record:
                (Path(record) / "imported").touch()
        return None  # the normal finders import it


sys.meta_path.insert(0, _SlowLightning())
