"""A two-node SLURM on this machine for the cluster tier: each node a Linux network namespace with its own address
(10.77.0.11 and 10.77.0.12 on 10.77.0.0/24), joined by veth pairs to a bridge on the host side (10.77.0.1), each
running its own slurmd; slurmctld and munged run on the host, and the file system (munge's socket, the job folders,
the data) is shared, like a cluster with a shared home.

Each slurmd starts as ``nsenter --net=/var/run/netns/NAME unshare --mount ... slurmd -N NAME``: ``nsenter``, not
``ip netns exec`` (which remounts /sys, hiding the cgroup mounts: slurmd then fails with "No filesystem mounted on
/sys/fs/cgroup"), and a private mount namespace in which the node's own ``hosts-NAME`` file of the tier is
bind-mounted over /etc/hosts, so that the node names resolve, or not, or each node's own name to 127.0.1.1 as in
Debian's default (:meth:`NamespaceSlurm.names_resolve`), for the node's daemon and every task it starts, without
changing the machine's /etc/hosts. The interface inside each namespace is named ``fmdp`` on both nodes. The
namespaces share the machine's host name, which resolves to 127.0.0.1 there: gloo would offer its peers a loopback
address, unless told otherwise (train.py picks the interface that routes to the rendezvous address).

Nothing here touches ip_forward or any other sysctl: the bridge joins the namespaces at layer 2. Every name this
creates starts with ``fmdp``; a namespace or link left by an interrupted run is removed at start, under a lock
(:data:`LOCK`) that a second cluster of this kind waits for. :meth:`NamespaceSlurm.stop` removes all of it, and
:meth:`NamespaceSlurm.left` says what would be left (the tier's end checks it is nothing).
"""

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import List

from tests.cluster.local_slurm import LocalSlurm, _alive, _node_cpus, kill_all

PREFIX = "fmdp"  # every namespace, link and node name this cluster creates
NODES = ("fmdp-node0", "fmdp-node1")  # SLURM node names and network namespace names
SUBNET = "10.77.0"
BRIDGE, BRIDGE_ADDR = f"{PREFIX}br", f"{SUBNET}.1"
IFNAME = PREFIX  # the interface inside each namespace (the same name on both nodes)
LOCK = Path("/tmp/fashion-mnist-netns.lock")  # held while a namespace cluster exists; a dead holder releases it
SLURMD_TIMEOUT_S = 30  # a node whose slurmd is gone is DOWN and its jobs end this long after its last answer


def node_addr(index: int) -> str:
    return f"{SUBNET}.{11 + index}"


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: exit {result.returncode}: {result.stderr.strip()}")
    return result


def namespaces() -> List[str]:
    """The network namespaces of this kind now present (``ip netns list``)."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(PREFIX)]


def links() -> List[str]:
    """The host-side links of this kind now present (the bridge, the veth ends)."""
    lines = _ip("-o", "link", "show", check=False).stdout.splitlines()
    names = [line.split(":")[1].strip().split("@")[0] for line in lines if ":" in line]
    return [name for name in names if name.startswith(PREFIX)]


def namespace_pids(name: str) -> List[int]:
    return [int(pid) for pid in _ip("netns", "pids", name, check=False).stdout.split()]


def net_namespace_inode(name: str) -> int:
    """The inode of a namespace: ``os.stat(f"/proc/{pid}/ns/net").st_ino`` of every process in it."""
    return os.stat(f"/var/run/netns/{name}").st_ino


def remove_network() -> None:
    """SIGKILL every process in a namespace of this kind, then delete the namespaces and links (a run's own, or what
    an interrupted run left); what is absent is skipped."""
    for name in namespaces():
        kill_all(namespace_pids(name))
        _ip("netns", "del", name, check=False)
    for link in links():  # deleting one end of a veth pair deletes the other; the bridge last
        _ip("link", "del", link, check=False)


class NamespaceSlurm(LocalSlurm):
    """Two SLURM nodes, each in its own network namespace with its own address; slurmctld on the bridge address."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.nodes = NODES
        self._lock = None

    def hosts(self, node: str) -> Path:
        """The file ``node``'s slurmd and its tasks see as /etc/hosts."""
        return self.folder / f"hosts-{node}"

    def names_resolve(self, resolve: bool, own_on_loopback: bool = False) -> None:
        """Make the node names resolve to their addresses on the nodes (``True``) or not at all (``False``); with
        ``own_on_loopback``, each node's own name to 127.0.1.1 there (Debian's default /etc/hosts; the other node's
        name as DNS would give it). Each node's ``hosts`` file rewritten in place (the bind mount follows the inode)."""
        for node in self.nodes:
            lines = ["127.0.0.1 localhost", f"127.0.0.1 {self.host}"]
            if resolve:
                lines += [f"{'127.0.1.1' if own_on_loopback and name == node else node_addr(i)} {name}"
                          for i, name in enumerate(self.nodes)]
            path = self.hosts(node)
            with open(path, "r+" if path.exists() else "w") as hosts:
                hosts.seek(0)
                hosts.truncate()
                hosts.write("\n".join(lines) + "\n")

    def _write_config(self) -> None:
        super()._write_config()
        f = self.folder
        lines = [line for line in self.conf.read_text().splitlines()
                 if not line.startswith(("SlurmctldHost=", "SlurmdSpoolDir=", "SlurmdPidFile=", "SlurmdLogFile=",
                                         "NodeName=", "PartitionName="))]
        nodes = f"{PREFIX}-node[0-{len(self.nodes) - 1}]"
        self.conf.write_text("\n".join([
            *lines,
            f"SlurmctldHost={self.host}({BRIDGE_ADDR})",
            f"SlurmdSpoolDir={f / 'spool-%n'}",
            f"SlurmdPidFile={f / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={f / 'log' / 'slurmd-%n.log'}",
            f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
            *(f"NodeName={node} NodeAddr={node_addr(i)} CPUs={_node_cpus()} State=UNKNOWN"
              for i, node in enumerate(self.nodes)),
            f"PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            "",
        ]))
        for node in self.nodes:
            (f / f"spool-{node}").mkdir(exist_ok=True)
        if not self.hosts(self.nodes[0]).exists():
            self.names_resolve(True)

    def _network(self) -> None:
        remove_network()  # what an interrupted run left (the lock says no other cluster of this kind is up)
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_ADDR}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for i, node in enumerate(self.nodes):
            host_end, node_end = f"{PREFIX}v{i}", f"{PREFIX}p{i}"
            _ip("netns", "add", node)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
            _ip("link", "set", node_end, "netns", node)
            _ip("link", "set", host_end, "master", BRIDGE)
            _ip("link", "set", host_end, "up")
            _ip("-n", node, "link", "set", node_end, "name", IFNAME)
            _ip("-n", node, "addr", "add", f"{node_addr(i)}/24", "dev", IFNAME)
            _ip("-n", node, "link", "set", IFNAME, "up")
            _ip("-n", node, "link", "set", "lo", "up")

    def on_host(self, node: str) -> List[str]:
        """The argv prefix that runs a command as on host ``node`` without SLURM: in its network namespace, with the
        node's name as its host name (a UTS namespace of its own) and the node's ``hosts`` as /etc/hosts."""
        return ["nsenter", f"--net=/var/run/netns/{node}", "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"', node,
                str(self.hosts(node))]

    def start_slurmd(self, node: str) -> None:
        """The node's slurmd in its namespace, with the node's ``hosts`` as its /etc/hosts (a mount namespace of its
        own, private, so nothing reaches the machine's mounts)."""
        pid_file = self.folder / f"slurmd-{node}.pid"
        pid_file.unlink(missing_ok=True)
        self._daemon(f"slurmd-{node}", [
            "nsenter", f"--net=/var/run/netns/{node}", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", 'mount --bind "$0" /etc/hosts && exec slurmd -N "$1" -f "$2"',
            str(self.hosts(node)), node, str(self.conf)], pid_file)

    def start(self, timeout_s: float = 60) -> "NamespaceSlurm":
        try:
            self._lock = open(LOCK, "w")
            fcntl.flock(self._lock, fcntl.LOCK_EX)  # another cluster of this kind: wait until it has stopped
            self._write_config()
            self._network()
            self._start_controller()
            for node in self.nodes:
                self.start_slurmd(node)
            self.wait_idle(timeout_s)
            return self
        except BaseException:
            self.stop()
            raise

    def wait_idle(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        states: List[str] = []
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
            if len(states) == len(self.nodes) and all(s in ("idle", "mixed", "allocated") for s in states):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes are {states}, not idle, {timeout_s:.0f} s after start:\n"
                           f"{self.log_tail('slurmctld')}\n" + "\n".join(self.log_tail(f"slurmd-{n}")
                                                                          for n in self.nodes))

    def log_tail(self, daemon: str, chars: int = 3000) -> str:
        return super().log_tail(daemon, chars)

    def kill_node(self, node: str) -> None:
        """A node dies: SIGKILL its slurmd and every process in its namespace (its slurmstepd, its tasks)."""
        self.pids.pop(f"slurmd-{node}", None)
        kill_all(namespace_pids(node))

    def stop(self) -> None:
        """LocalSlurm's stop (every job cancelled, the daemons by pid, then every process with this SLURM_CONF),
        then every process left in the namespaces, the namespaces, the veth pairs and the bridge; then the lock."""
        try:
            super().stop()
            for node in self.nodes:  # LocalSlurm.stop knows "slurmd", not the node daemons: stop them by pid too
                pid = self.pids.pop(f"slurmd-{node}", None)
                if pid is not None and _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            remove_network()
        finally:
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    def left(self) -> List[str]:
        """What this cluster would leave behind: namespaces, links, processes with its SLURM_CONF; empty after stop."""
        return ([f"namespace {name}" for name in namespaces()] + [f"link {name}" for name in links()]
                + [f"process {pid}" for pid in self.leftovers()])
