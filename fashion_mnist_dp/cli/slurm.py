"""What the Trainer cannot check about the job around it: srun's tasks, whether the rendezvous address resolves, and
which network gloo offers its peers."""

import contextlib
import fcntl
import ipaddress
import os
import re
import socket
import struct
import subprocess
from typing import Callable, List, Mapping, MutableMapping, Optional, Tuple

SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address


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


def addresses(host: str) -> List[str]:
    """The addresses ``host`` resolves to here; none when it does not resolve."""
    try:
        return [info[4][0].split("%")[0] for info in socket.getaddrinfo(host, 9)]
    except (OSError, UnicodeError):
        return []


def _loopback(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address first, or not at all: gloo then offers its peers 127.0.0.1 (it
    takes the first address that binds)."""
    found = addresses(host)
    return not found or ipaddress.ip_address(found[0]).is_loopback


def scontrol(run: Callable, *args: str) -> str:
    """What ``scontrol ARGS`` prints, or nothing when it fails or cannot run."""
    try:
        shown = run(["scontrol", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (shown.stdout or "") if shown.returncode == 0 else ""


def rendezvous_address(environment, environ: MutableMapping[str, str] = os.environ,
                       run: Callable = subprocess.run) -> Tuple[str, Optional[str]]:
    """The rendezvous address and a start-block note when SLURM's ``NodeAddr`` (exported as ``MASTER_ADDR``) replaced
    a name that does not resolve here; else LookupError with the line (docs/running-on-clusters.md)."""
    address = environment.main_address
    if addresses(address):
        return address, None
    where = "MASTER_ADDR" if environ.get("MASTER_ADDR") else "the first node of SLURM_NODELIST"
    shown = scontrol(run, "show", "node", address) if "SLURM_JOB_ID" in environ else ""  # SLURM's NodeAddr for it
    node_address = (re.findall(r"\bNodeAddr=(\S+)", shown) or [address])[0]
    if node_address != address and addresses(node_address):
        environ["MASTER_ADDR"] = node_address
        return node_address, f"  rendezvous      : {node_address}, SLURM's NodeAddr of {address} ({address} does not " \
                             f"resolve here)"
    slurm = ", and SLURM knows no address for it" if "SLURM_JOB_ID" in environ else ""
    raise LookupError(f"the rendezvous address {address} ({where}) does not resolve on this host{slurm}: set "
                      f"MASTER_ADDR to the IP address of rank 0's node, or make {address} resolve here (DNS, "
                      f"/etc/hosts)")


def interface_addresses(name: str) -> List[str]:
    """The addresses of this host's interface ``name``: its IPv4 one (SIOCGIFADDR) and its IPv6 ones (/proc)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, contextlib.suppress(OSError):
        found.append(socket.inet_ntoa(fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()))
                                      [20:24]))
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as table:
        found += [line.split()[0] for line in table if line.split()[-1:] == [name]]
    return found


def rendezvous_environment_problem(environ: Mapping[str, str], gloo: bool) -> Optional[Tuple[str, bool]]:
    """What is wrong with the rendezvous's variables, before any rank starts, and whether it is the network (an
    interface this host does not have, or one without an address) rather than a bad value; None when nothing is.
    ``gloo``: the run's backend is gloo, which GLOO_SOCKET_IFNAME steers."""
    port = environ.get("MASTER_PORT")
    if port is not None and not (port.strip().isdigit() and 1 <= int(port) <= 65535):
        return (f"MASTER_PORT is {port!r}: give a TCP port from 1 to 65535 that rank 0's node can listen on, or unset "
                f"it on one machine (train.py then picks a free one)"), False
    if "MASTER_ADDR" in environ and not environ["MASTER_ADDR"].strip():
        return ("MASTER_ADDR is set but empty: give the host name or IP address of rank 0's node, or unset it on one "
                "machine"), False
    given = environ.get("GLOO_SOCKET_IFNAME", "")
    have = sorted(name for _, name in socket.if_nameindex())
    for name in [part.strip() for part in given.split(",") if part.strip()] if gloo else []:
        if name not in have:
            return (f"GLOO_SOCKET_IFNAME is {given!r}, but this host has no interface {name} (it has "
                    f"{', '.join(have)}): set it to the interface that reaches the other nodes, or unset it"), True
        if not interface_addresses(name):
            return (f"GLOO_SOCKET_IFNAME is {given!r}, but interface {name} has no address here (down, or not "
                    f"configured): set it to an interface that reaches the other nodes, or unset it"), True
    return None


def route_interface(target: str) -> Optional[str]:
    """The interface the kernel routes to IPv4 ``target`` through, the one holding the route's source address (a UDP
    socket's connect() sends nothing), else None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, contextlib.suppress(OSError):
        probe.connect((target, 9))
        source = probe.getsockname()[0]
        return next((name for _, name in socket.if_nameindex() if source in interface_addresses(name)), None)
    return None


def gloo_interface(rendezvous: str, environ: MutableMapping[str, str] = os.environ,
                   run: Callable = subprocess.run) -> Optional[str]:
    """Where GLOO_SOCKET_IFNAME is unset and the host name resolves to a loopback address (Debian's 127.0.1.1), gloo
    would offer its peers 127.0.0.1: set it to the interface that routes to the rendezvous address (on the rendezvous
    node, whose name may be loopback there too, to another node of the SLURM job) and return the start block's line;
    else None (gloo's own choice, also for a job on one host)."""
    host = socket.gethostname()
    if environ.get("GLOO_SOCKET_IFNAME") or not _loopback(host):
        return None
    target, why = rendezvous, ""
    if _loopback(rendezvous):  # the first node of the SLURM job whose name resolves to a real address here
        nodes = scontrol(run, "show", "hostnames", environ["SLURM_NODELIST"]) if "SLURM_NODELIST" in environ else ""
        target = next((node for node in nodes.split() if not _loopback(node)), None)
        why = f", a node of this job: {rendezvous} resolves to loopback here"
    name = route_interface(target) if target else None
    if name:
        environ["GLOO_SOCKET_IFNAME"] = name
        return f"  gloo interface  : {name} (routes to {target}{why}; GLOO_SOCKET_IFNAME unset, {host} resolves to " \
               f"loopback)"
    return None
