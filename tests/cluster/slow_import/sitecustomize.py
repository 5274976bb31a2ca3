"""On PYTHONPATH for a test: under srun, task 1 takes 8 s longer to import Lightning (as on a slow shared file
system), so it is still starting up when another task fails."""

import os
import sys
import time


class _SlowLightning:
    def find_spec(self, name, path=None, target=None):
        if name == "lightning" and os.environ.get("SLURM_PROCID") == "1":
            time.sleep(8)
        return None  # the normal finders import it


sys.meta_path.insert(0, _SlowLightning())
