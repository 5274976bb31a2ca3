"""What the Trainer cannot check about the job around it: srun's tasks, and whether the rendezvous address resolves."""

import os
import re
import socket
import subprocess
from typing import Callable, Mapping, MutableMapping, Optional, Tuple


def check_slurm_layout(environ: Mapping[str, str], want, nodes: int) -> Optional[str]:
    """Under srun, why the tasks SLURM started are not the ranks the Trainer expects (``want``: the parsed
    ``--devices``), else None: they would fail on every task or wait for peers that never come."""
    if "SLURM_NTASKS" not in environ or environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None  # not SLURM-managed (Lightning's own rule: an interactive job launches its processes itself)
    tasks = int(environ.get("SLURM_NTASKS", "1"))
    per_node_text = environ.get("SLURM_NTASKS_PER_NODE")
    how = f"srun --nodes {nodes} --ntasks-per-node {want if isinstance(want, int) else 'DEVICES'} python train.py ..."
    if per_node_text is None:
        if tasks > 1:
            return (f"SLURM started {tasks} tasks without --ntasks-per-node, which Lightning needs to place ranks: "
                    f"run '{how}' (docs/running-on-clusters.md)")
        return None
    per_node = int(per_node_text.split("(")[0])
    slurm_nodes = int(environ.get("SLURM_NNODES", environ.get("SLURM_JOB_NUM_NODES", "1")))
    devices_per_node = len(want) if isinstance(want, list) else want
    if isinstance(devices_per_node, int) and devices_per_node > 0 and per_node != devices_per_node:
        return (f"SLURM started {per_node} task(s) per node but --devices is {devices_per_node}: one task per device, "
                f"so run '{how}' or give --devices {per_node}")
    if slurm_nodes != nodes:
        return (f"SLURM allocated {slurm_nodes} node(s) but --num_nodes is {nodes}: give --num_nodes {slurm_nodes}, "
                f"or run '{how}'")
    return None


def resolves(host: str) -> bool:
    try:
        return bool(socket.getaddrinfo(host, None))
    except (socket.gaierror, UnicodeError, OSError):
        return False


def slurm_node_address(node: str, run: Callable = subprocess.run) -> Optional[str]:
    """SLURM's ``NodeAddr`` for ``node`` (``scontrol show node``), or None when SLURM has none or cannot say."""
    try:
        shown = run(["scontrol", "show", "node", node], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\bNodeAddr=(\S+)", shown.stdout or "") if shown.returncode == 0 else None
    return found.group(1) if found and found.group(1) != node else None


def rendezvous_address(environment, environ: MutableMapping[str, str] = os.environ,
                       run: Callable = subprocess.run) -> Tuple[str, Optional[str]]:
    """The rendezvous address and a start-block note when SLURM's ``NodeAddr`` (exported as ``MASTER_ADDR``) replaced
    a name that does not resolve here; else LookupError with the line (docs/running-on-clusters.md)."""
    address = environment.main_address
    if resolves(address):
        return address, None
    where = "MASTER_ADDR" if environ.get("MASTER_ADDR") else "the first node of SLURM_NODELIST"
    node_address = slurm_node_address(address, run) if "SLURM_JOB_ID" in environ else None
    if node_address and resolves(node_address):
        environ["MASTER_ADDR"] = node_address
        return node_address, f"  rendezvous      : {node_address}, SLURM's NodeAddr of {address} ({address} does not " \
                             f"resolve here)"
    slurm = ", and SLURM knows no address for it" if "SLURM_JOB_ID" in environ else ""
    raise LookupError(f"the rendezvous address {address} ({where}) does not resolve on this host{slurm}: set "
                      f"MASTER_ADDR to the IP address of rank 0's node, or make {address} resolve here (DNS, "
                      f"/etc/hosts)")
