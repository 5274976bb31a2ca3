"""A real SLURM on this machine for the cluster tier: munged, slurmctld and slurmd from Debian's packages (slurm-wlm,
munge), with their key, configuration, state, sockets and logs in one folder, on ports of their own, started and
stopped by pid. Nothing of the system's own configuration (/etc/slurm, /etc/munge, /run/munge) is read or changed.

``LocalSlurm(folder).start()`` returns once ``sinfo`` shows the node idle; every SLURM command a test runs gets
``SLURM_CONF`` from :meth:`LocalSlurm.env`. ``python -m tests.cluster.local_slurm FOLDER`` starts one and keeps it
up until Ctrl-C or SIGTERM, to try the recipes of docs/running-on-clusters.md by hand.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.launch import free_port
from tests import apt

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
# A requeued job's delay is cred_expire + 1 s; 10 s here (SLURM's minimum is 5, its default 120: give
# FASHION_MNIST_SLURM_CRED_EXPIRE=120 to run the tier with SLURM's default delay)
CRED_EXPIRE_S = int(os.environ.get("FASHION_MNIST_SLURM_CRED_EXPIRE", "10"))
COMMANDS = ("srun", "sbatch", "scancel", "scontrol", "squeue", "sinfo")  # what the tier runs


def kill_all(pids: List[int], wait_s: float = 10) -> None:
    """SIGKILL ``pids`` (those already gone are skipped) and wait up to ``wait_s`` for them to be gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def missing_programs() -> List[str]:
    return [name for name in (*DAEMONS, *COMMANDS) if shutil.which(name) is None]


def install_reason() -> Optional[str]:
    """SLURM and munge installed when missing (tests/apt.py); None when they are there now, else the skip reason."""
    return apt.install_reason(PACKAGES, missing_programs)


def _node_cpus() -> int:
    return len(os.sched_getaffinity(0))


class LocalSlurm:
    """One controller and one node daemon on 127.0.0.1, the node named after this host (as ``srun`` expects)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge" / "munge.socket"
        self.pids: Dict[str, int] = {}

    def env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """This process's environment with SLURM_CONF pointing at this cluster (for sbatch, srun, scontrol...)."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def _write_config(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        (self.folder / "munge").chmod(0o700)
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        f = self.folder
        self.conf.write_text("\n".join([
            "ClusterName=fashion",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # A requeued job waits cred_expire + 1 s before it starts again (SLURM's own delay, 121 s by default): the
            # old job's credential is revoked, so a start within the same second fails ("Job credential revoked")
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_S}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1",  # start a requeued or new job within seconds
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}",
            f"SlurmdPidFile={f / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MinJobAge=300",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={_node_cpus()} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            "",
        ]))

    def _daemon(self, name: str, argv: List[str], pid_file: Path) -> None:
        """Start a daemon that forks into the background, then read its pid from its pid file."""
        result = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{name} did not start (exit {result.returncode}): {result.stderr.strip()}\n"
                               f"{self.log_tail(name)}")
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start (exit {result.returncode}): {result.stderr.strip()}\n"
                                   f"{self.log_tail(name)}")
            time.sleep(0.1)
        self.pids[name] = int(pid_file.read_text().split()[0])

    def _start_controller(self) -> None:
        """munged and slurmctld, on the host."""
        munge = self.folder / "munge"
        self._daemon("munged", ["munged", "--force", f"--socket={self.munge_socket}",
                                f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                                f"--log-file={self.folder / 'log' / 'munged.log'}",
                                f"--seed-file={munge / 'munged.seed'}"], munge / "munged.pid")
        self._daemon("slurmctld", ["slurmctld", "-i", "-f", str(self.conf)], self.folder / "slurmctld.pid")

    def start(self, timeout_s: float = 60) -> "LocalSlurm":
        """Start the three daemons; if any fails to start, stop what did start (:meth:`stop`), then raise."""
        try:
            self._write_config()
            self._start_controller()
            self._daemon("slurmd", ["slurmd", "-f", str(self.conf)], self.folder / "slurmd.pid")
            deadline = time.monotonic() + timeout_s
            state = ""
            while time.monotonic() < deadline:
                state = self.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip()
                if state in ("idle", "mixed", "allocated"):
                    return self
                time.sleep(0.5)
            raise RuntimeError(f"the SLURM node is {state!r}, not idle, {timeout_s:.0f} s after start:\n"
                               f"{self.log_tail('slurmctld')}\n{self.log_tail('slurmd')}")
        except BaseException:
            self.stop()
            raise

    def run(self, *argv: str, timeout: float = 60, env: Optional[Dict[str, str]] = None,
            cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        """A SLURM command against this cluster (``run("scontrol", "show", "job", "7")``); ``env`` (SLURM_CONF is
        added) for what sbatch and srun pass on to the job, else this process's environment."""
        env = self.env() if env is None else {**env, "SLURM_CONF": str(self.conf)}
        return subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)

    def log_tail(self, daemon: str, chars: int = 3000) -> str:
        path = self.folder / "log" / f"{daemon}.log"
        return f"--- {path}:\n{path.read_text(errors='replace')[-chars:]}" if path.exists() else f"(no {path})"

    def stop(self) -> None:
        """Cancel every job and wait (up to 60 s) until none is left, then stop slurmd, slurmctld and munged by pid
        (SIGKILL after 10 s), then SIGKILL every process still running with this cluster's ``SLURM_CONF`` (a job's
        tasks and slurmstepd outlive their daemons, a daemon whose pid file never appeared)."""
        if "slurmctld" in self.pids:
            try:
                self.run("scancel", "--full", "--user", "root", timeout=10)
                deadline = time.monotonic() + 60
                while self.run("squeue", "-h", timeout=10).stdout.strip() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for name in reversed(DAEMONS):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        kill_all(self.leftovers())

    def leftovers(self) -> List[int]:
        """Processes other than this one whose environment names this cluster's configuration: every daemon, job
        script, task and slurmstepd it started inherits ``SLURM_CONF`` from :meth:`env`."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0") and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not our child, so reaped by init soon) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    reason = install_reason()
    if reason:
        sys.exit(f"local_slurm: {reason}")
    cluster = LocalSlurm(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("slurm-local")).start()
    print(f"SLURM up: export SLURM_CONF={cluster.conf}   (Ctrl-C or SIGTERM stops it)", flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
