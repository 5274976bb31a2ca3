"""What a torchrun worker can tell about its restarts, from the variables torchrun's agent sets for it.

``torchrun --max-restarts N`` re-runs the same command when a worker fails, so ``--ckpt_path last``
must also start the first attempt (train.py). On one host the restarts themselves are unreliable
with torch 2.14's default: the rendezvous's TCP store is shared with the workers
(``TORCHELASTIC_USE_AGENT_STORE=True``) and outlives an attempt, so the keys the last attempt's
process group wrote (each rank's gloo address) are still there when the next attempt's ranks look
them up; a rank can read a dead rank's address before its successor overwrites it. Measured here
(tests/test_restarts.py, docs/reliability.md): ``Gloo connectFullMesh failed ... Connection refused``
(the restart fails and uses up a restart) or both ranks waiting in gloo's connect for more than
10 minutes (pytorch/pytorch#135712). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in torchrun's own
environment makes its c10d rendezvous give every attempt a fresh store; the static rendezvous
(``--master-port`` / ``--master-addr`` given) always shares its store, the variable does not change
it. The workers cannot fix this: the agent has decided before they start, and the attempt number
is not the same on every node, so it cannot name a fresh key space either. So train.py warns.
"""

import os
from typing import Mapping, Optional

DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return max(0, int(environ.get(name, "0") or 0))
    except ValueError:
        return 0


def max_restarts(environ: Mapping[str, str] = os.environ) -> int:
    """torchrun's ``--max-restarts`` when this process is one of its workers, else 0."""
    return _int(environ, "TORCHELASTIC_MAX_RESTARTS")


def attempt(environ: Mapping[str, str] = os.environ) -> int:
    """1 for torchrun's first attempt (and outside torchrun), 2 after its first restart, ..."""
    return _int(environ, "TORCHELASTIC_RESTART_COUNT") + 1


def shared_store_warning(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The line to print when torchrun may restart this job but shares its rendezvous store with it, else None."""
    if max_restarts(environ) == 0 or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return (f"torchrun --max-restarts {max_restarts(environ)} shares its rendezvous store with the workers, so a "
            f"restart can fail to connect or hang (pytorch/pytorch#135712): start torchrun with "
            f"{DISABLE_SHARED_STORE}=1 in its environment and its c10d rendezvous (no --master-port on one node; "
            f"--rdzv-backend c10d --rdzv-endpoint HOST:PORT on several)")
