"""docs/running-on-clusters.md's sbatch script on two SLURM nodes that are two hosts with their own addresses: two
network namespaces, each with its own slurmd (tests/cluster/netns_slurm.py). The script runs with ``--nodes 2
--ntasks-per-node 2``: ddp over gloo on 4 ranks, two per node, meeting where Lightning's SLURMEnvironment says (the
first node of SLURM_NODELIST), with node names that resolve on the nodes and with names that do not (SLURM's
NodeAddr instead, fashion_mnist_dp/cli/slurm.py); then a node dies mid-epoch. And the document's several-nodes
torchrun line with one agent in each namespace, a worker killed and the group restarted.

Every job trains the mlp on the tiny data, seeded and deterministic: 4 ranks x batch 32 = 2 optimizer steps per
epoch. The tests share one cluster and run one after another on one pytest worker (xdist_group).
"""

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch
from torchvision.datasets import FashionMNIST

from benchmarks.launch import TRAIN_PY, clean_env, running_in, start, wait_all
from datamodules.files import RAW_FILES, raw_folder
from tests.cluster import recipes
from tests.cluster.netns_slurm import (BRIDGE, IFNAME, PREFIX, SLURMD_TIMEOUT_S, SUBNET, links, namespace_pids,
                                       namespaces, net_namespace_inode, node_addr)
from tests.mirror import Mirror, write_archives
from tests.cluster.recipes import assert_same_weights, final_checkpoint, sbatch_script, torchrun_recipe
from tests.cluster.test_slurm import job_info, wait_job
from tests.cluster.test_torchrun import MULTI_NODE

pytestmark = pytest.mark.xdist_group("two-nodes")  # one cluster: all on one worker (make's --dist loadgroup)

NODES, TASKS_PER_NODE = 2, 2
WORLD = NODES * TASKS_PER_NODE
EPOCHS = 2
STEPS_PER_EPOCH = 256 // (WORLD * 32)
COLLECTIVE_TIMEOUT_S = 30  # the tier's: a lost peer ends its ranks within this, not the default 300 s
SEEDED = [*recipes.SEEDED, "--collective_timeout", str(COLLECTIVE_TIMEOUT_S),
          "--trainer.callbacks+=tests.recorder.WhereRanksRun"]
JOB_TIMEOUT_S = 180
# A node that dies ends the whole job within SLURM's SlurmdTimeout and its ping interval (a third of it), its
# KillWait, and the collective timeout (docs/running-on-clusters.md)
NODE_FAULT_BOUND_S = SLURMD_TIMEOUT_S + SLURMD_TIMEOUT_S / 3 + 30 + COLLECTIVE_TIMEOUT_S
MIRROR_ADDR = f"{SUBNET}.2"  # the test mirror's own address, on the bridge beside slurmctld's


def sbatch(cluster, folder: Path, extra: List[str], flags: Tuple[str, ...] = (), **env: str) -> str:
    """The document's sbatch script with ``--nodes 2 --ntasks-per-node 2``, submitted from ``folder`` (``flags``:
    sbatch's own, before the script; ``env``: variables the job gets besides SLURM_CONF)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "train.sbatch"
    script.write_text(sbatch_script(extra, nodes=NODES, tasks_per_node=TASKS_PER_NODE))
    result = cluster.run("sbatch", "--parsable", "--chdir", str(folder), "--output", str(folder / "slurm.out"),
                         *flags, str(script), env=clean_env(env))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def output(folder: Path) -> str:
    path = folder / "slurm.out"
    return path.read_text(errors="replace") if path.exists() else "(no slurm.out yet)"


def where(record: Path) -> List[Dict]:
    return [json.loads((record / f"where{rank}.json").read_text()) for rank in range(WORLD)]


def ranks_in(folder: Path) -> List[int]:
    """The job's train.py processes (its ranks), on either node."""
    ranks = []
    for pid in running_in(folder):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == sys.executable.encode() and str(TRAIN_PY).encode() in argv:  # not srun, whose line names it
            ranks.append(pid)
    return ranks


def snapshot(root: Path) -> Dict[str, Tuple[int, int]]:
    """Every file under ``root``: (size, mtime in ns). The data folder both nodes read must be left as it was."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def train(cluster, data_dir: Path, folder: Path, *extra: str) -> Tuple[Dict[str, str], str, List[Dict]]:
    """The sbatch script's job of 4 ranks (no GLOO_SOCKET_IFNAME: train.py picks the interface), to its end."""
    record = folder / "record"
    record.mkdir(parents=True)
    job = sbatch(cluster, folder, [*SEEDED, "--epochs", str(EPOCHS), "--data_dir", str(data_dir), *extra],
                 SAMPLE_RECORD_DIR=str(record))
    info = wait_job(cluster, job, timeout_s=JOB_TIMEOUT_S)
    text = output(folder)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"
    assert "Traceback" not in text, text[-4000:]
    return info, text, where(record)


def assert_two_ranks_in_each_nodes_namespace(cluster, ranks: List[Dict]) -> None:
    """Global ranks 0, 1 on the first node, 2, 3 on the second, each process inside its node's network namespace,
    one group of 4 meeting at the first node of SLURM_NODELIST (Lightning's SLURMEnvironment)."""
    inodes = {node: net_namespace_inode(node) for node in cluster.nodes}
    assert len(set(inodes.values())) == NODES
    for rank, seen in enumerate(ranks):
        node = cluster.nodes[rank // TASKS_PER_NODE]
        assert (seen["node"], seen["node_rank"], seen["local_rank"]) == (node, rank // TASKS_PER_NODE,
                                                                        rank % TASKS_PER_NODE), seen
        assert seen["net_ns"] == inodes[node], f"rank {rank} is not in {node}'s network namespace: {seen}"
        assert (seen["environment"], seen["world_size"]) == ("SLURMEnvironment", WORLD), seen
        assert seen["gloo_socket_ifname"] == IFNAME, seen  # train.py's choice in each rank: the route to rank 0
    assert len({(seen["main_address"], seen["main_port"]) for seen in ranks}) == 1, ranks


def gloo_line(target: str) -> str:
    """The start block's line: the nodes' host name (this machine's) resolves to 127.0.0.1 in the tier's hosts files."""
    return f"gloo interface  : {IFNAME} (routes to {target}; GLOO_SOCKET_IFNAME unset, {socket.gethostname()} " \
           f"resolves to loopback)"


@pytest.fixture(scope="module")
def one_host(fashion_root, tmp_path_factory) -> dict:
    """The same 4 ranks on one host (Lightning's own launcher, 127.0.0.1): what the two-node jobs must end as."""
    folder = tmp_path_factory.mktemp("one-host")
    args = ["--strategy", "ddp", "--accelerator", "cpu", "--devices", str(WORLD), *recipes.SEEDED,
            "--epochs", str(EPOCHS), "--data_dir", str(fashion_root)]
    result = subprocess.run([sys.executable, str(TRAIN_PY), *args], cwd=folder, env=clean_env(),
                            capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    return final_checkpoint(folder)


def test_srun_puts_one_task_on_each_node_inside_that_nodes_network_namespace(two_nodes):
    probe = "import os; print(os.environ['SLURMD_NODENAME'], os.stat('/proc/self/ns/net').st_ino)"
    result = two_nodes.run("srun", "-N", "2", "--ntasks-per-node", "1", sys.executable, "-c", probe, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = dict(line.split() for line in result.stdout.splitlines())
    assert seen == {node: str(net_namespace_inode(node)) for node in two_nodes.nodes}, result.stdout


def test_the_sbatch_script_trains_on_two_nodes_and_ends_as_the_same_ranks_on_one_host(two_nodes, fashion_root,
                                                                                      one_host, tmp_path):
    """Debian's default /etc/hosts on each node: the host name on 127.0.0.1 and the node's own name on 127.0.1.1, so
    the rendezvous address, the first node's name, is loopback there and the other node's address on the second. No
    interface is named: each rank picks the one that routes to the rendezvous address, or, on the first node, to the
    other node of the job. Each rank's record checks its choice: without the first node's, this job still trains,
    since gloo's pair dials from the larger address and 127.0.0.1 > 10.77.0.12; on a network above 127 (192.168.x)
    the second node would dial 127.0.0.1 (checked by breaking it once: the record, not the job, failed)."""
    data = snapshot(fashion_root)
    first, second = two_nodes.nodes
    two_nodes.names_resolve(True, own_on_loopback=True)
    try:
        _, text, ranks = train(two_nodes, fashion_root, tmp_path / "job")
    finally:
        two_nodes.names_resolve(True)
    assert_two_ranks_in_each_nodes_namespace(two_nodes, ranks)
    assert ranks[0]["main_address"] == first  # the node name, resolved on each node by its hosts file
    assert "rendezvous      :" not in text  # nothing replaced
    assert gloo_line(f"{second}, a node of this job: {first} resolves to loopback here") in text, text[-4000:]
    assert f"world size      : {WORLD} ({TASKS_PER_NODE} device(s) x {NODES} node(s), cpu" in text, text[-4000:]
    assert [line.split(":")[0] for line in text.splitlines() if line.startswith("Epoch ")] == \
        [f"Epoch {e}" for e in range(1, EPOCHS + 1)]
    # Each node's local rank 0 prepared the shared data folder (both at once): it only read it
    assert snapshot(fashion_root) == data
    assert_same_weights(one_host, final_checkpoint(tmp_path / "job"), EPOCHS * STEPS_PER_EPOCH)


def test_node_names_that_do_not_resolve_meet_at_slurms_nodeaddr(two_nodes, fashion_root, one_host, tmp_path):
    two_nodes.names_resolve(False)
    try:
        _, text, ranks = train(two_nodes, fashion_root, tmp_path / "job")
    finally:
        two_nodes.names_resolve(True)
    first, address = two_nodes.nodes[0], node_addr(0)
    assert f"rendezvous      : {address}, SLURM's NodeAddr of {first} ({first} does not resolve here)" in text, \
        text[-4000:]
    assert_two_ranks_in_each_nodes_namespace(two_nodes, ranks)
    assert ranks[0]["main_address"] == address and gloo_line(address) in text
    assert_same_weights(one_host, final_checkpoint(tmp_path / "job"), EPOCHS * STEPS_PER_EPOCH)


def test_both_nodes_download_into_one_shared_folder_at_once_and_train_on_the_same_checked_files(
        two_nodes, one_host, tmp_path):
    """Both nodes' local rank 0 find the shared data folder empty and download into it at once, from a mirror on an
    address of its own (``--data.mirror``; tests/mirror.py holds each file until both nodes' downloads of it have
    started). Neither replaces the other's files: the folder ends with the tiny data's four files, byte for byte,
    and nothing else, and the 4 ranks end with the weights of the same ranks on one host."""
    served, shared = tmp_path / "mirror", tmp_path / "shared-data"
    served.mkdir()
    source = raw_folder(str(write_archives(served)))
    subprocess.run(["ip", "addr", "add", f"{MIRROR_ADDR}/24", "dev", BRIDGE], check=True, timeout=30)
    try:
        with Mirror(served, MIRROR_ADDR, together=NODES) as mirror:
            _, text, ranks = train(two_nodes, shared, tmp_path / "job", "--data.mirror", mirror.url,
                                   "--trainer.callbacks+=tests.recorder.ServedArchives",
                                   f"--trainer.callbacks.folder={served}")
    finally:
        subprocess.run(["ip", "addr", "del", f"{MIRROR_ADDR}/24", "dev", BRIDGE], timeout=30)
    assert gloo_line(two_nodes.nodes[0]) in text, text[-4000:]  # the rendezvous address resolves on both nodes
    for name, _ in FashionMNIST.resources:
        downloads = [d for d in mirror.downloads if d["file"] == name]
        assert sorted(d["client"] for d in downloads) == [node_addr(0), node_addr(1)], mirror.downloads
        assert max(d["start"] for d in downloads) < min(d["end"] for d in downloads), downloads  # at once
    raw = raw_folder(str(shared))
    assert {path.name: path.read_bytes() for path in raw.iterdir()} == \
        {name: (source / name).read_bytes() for name in RAW_FILES}
    assert [path.name for path in raw.parent.iterdir()] == ["raw"]  # no private download folder left
    assert_two_ranks_in_each_nodes_namespace(two_nodes, ranks)
    assert_same_weights(one_host, final_checkpoint(tmp_path / "job"), EPOCHS * STEPS_PER_EPOCH)


def test_the_users_gloo_socket_ifname_wins_and_a_wrong_one_ends_each_rank_with_one_line(two_nodes, fashion_root,
                                                                                        tmp_path):
    """GLOO_SOCKET_IFNAME=lo, the user's, is kept: gloo offers its peers 127.0.0.1 and cannot connect (as it did
    without any, before train.py chose the interface). Every rank ends with one line saying what to set (it was a
    traceback and exit 1), or with the line of a peer task that failed first; no rank is left."""
    folder = tmp_path / "job"
    job = sbatch(two_nodes, folder, [*SEEDED, "--epochs", "1", "--data_dir", str(fashion_root)],
                 flags=("--no-requeue",), GLOO_SOCKET_IFNAME="lo")
    info = wait_job(two_nodes, job, timeout_s=JOB_TIMEOUT_S)
    text = output(folder)
    lines = [line for line in text.splitlines() if line.startswith("train.py:")]
    assert info["JobState"] == "FAILED" and "Traceback" not in text and "gloo interface" not in text, \
        f"{info}\n{text[-4000:]}"
    assert any(re.fullmatch(r"train\.py: error: rank \d could not connect to the other ranks \(gloo: .*\): across hosts, "
                            r"set GLOO_SOCKET_IFNAME \(for NCCL, NCCL_SOCKET_IFNAME\) to the network interface .*", line)
               for line in lines), text[-4000:]
    assert all(re.search(r"could not connect to the other ranks|stopped because another task of SLURM step", line)
               for line in lines), text[-4000:]
    assert running_in(folder) == []


def test_a_node_dying_mid_epoch_ends_the_whole_job_with_one_line_and_no_rank_left(two_nodes, fashion_root,
                                                                                   tmp_path):
    """The second node's slurmd and every process in its namespace are SIGKILLed mid-epoch (the node is gone); the
    ranks on the first node lose their peers and end at once, and SLURM marks the node DOWN after SlurmdTimeout and
    ends the job. ``--no-requeue``: by default (JobRequeue=1) SLURM requeues a batch job whose node failed, and the
    script would resume from last.ckpt once two nodes are up again (not tested: this cluster has no third node)."""
    folder, record = tmp_path / "job", tmp_path / "record"
    record.mkdir()
    args = [*SEEDED, "--check_every_n_steps", "1", "--epochs", "50", "--data_dir", str(fashion_root),
            "--trainer.callbacks+=tests.recorder.SlowSteps", "--trainer.callbacks.mark_at=3"]
    job = sbatch(two_nodes, folder, args, flags=("--no-requeue",), SAMPLE_RECORD_DIR=str(record))
    dead, alive = two_nodes.nodes[1], two_nodes.nodes[0]
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not (record / "step").exists():  # step 3: mid-epoch 2
            assert time.monotonic() < deadline and job_info(two_nodes, job).get("JobState") in ("PENDING", "RUNNING"),\
                f"training never reached step 3: {job_info(two_nodes, job)}\n{output(folder)}"
            time.sleep(0.2)
        killed = time.monotonic()
        two_nodes.kill_node(dead)
        while ranks_in(folder) and time.monotonic() < killed + NODE_FAULT_BOUND_S:
            time.sleep(0.2)
        ranks_gone = time.monotonic() - killed
        info = wait_job(two_nodes, job, timeout_s=NODE_FAULT_BOUND_S + 30)
        while running_in(folder) and time.monotonic() < killed + NODE_FAULT_BOUND_S:  # the script, srun
            time.sleep(0.2)
        seconds = time.monotonic() - killed
        print(f"\ntwo nodes, the second one killed mid-epoch: no rank left {ranks_gone:.1f} s after the kill, job "
              f"{info['JobState']} (ExitCode {info['ExitCode']}) and no process of it left {seconds:.1f} s after it")
        text = output(folder)
        assert running_in(folder) == [], f"ranks left: {running_in(folder)}\n{text[-3000:]}"
        assert namespace_pids(dead) == [] and namespace_pids(alive) == [two_nodes.pids[f"slurmd-{alive}"]]
        assert ranks_gone < COLLECTIVE_TIMEOUT_S and seconds < NODE_FAULT_BOUND_S
        # SLURM ends the job NODE_FAIL; the batch script, still waiting in srun for the dead node's tasks, gets
        # SIGTERM (ExitCode 0:15)
        assert (info["JobState"], info["ExitCode"]) == ("NODE_FAIL", "0:15"), f"{info}\n{text[-4000:]}"
        # Each surviving rank: its own lost-connection line (exit 75), or, when a peer's SIGUSR2 to the step came
        # first, the "stopped because another task" line (exit 1); a rank that printed its line and then got srun's
        # SIGTERM ends with its code and no second line (fashion_mnist_dp/runtime/signals.py)
        lines = [line for line in text.splitlines() if line.startswith("train.py:")]
        assert lines and re.search(r"^train\.py: error: rank \d lost its connection to another rank", lines[0]), \
            text[-4000:]
        assert len(lines) == TASKS_PER_NODE and all(
            re.search(r"lost its connection to another rank|stopped because another task of SLURM step", line)
            for line in lines), text[-4000:]
        assert "Traceback" not in text
    finally:
        two_nodes.run("scancel", job)
        two_nodes.start_slurmd(dead)  # the node comes back for the tests after this one (ReturnToService=2)
        two_nodes.wait_idle()


def test_torchrun_agents_on_two_hosts_restart_a_killed_worker_and_end_as_the_same_ranks_on_one_host(
        two_nodes, fashion_root, one_host, tmp_path):
    """The document's several-nodes torchrun line, one agent in each namespace with the node's name as its host name
    (a UTS namespace of its own), the c10d rendezvous at ``fmdp-node0:29500`` (the document's HOST0 and port);
    global rank 3 SIGKILLs itself mid-epoch 2, one step after epoch 1's checkpoint; the agents restart the group,
    it resumes from last.ckpt and ends with the weights of the 4 ranks on one host."""
    folder, record = tmp_path / "job", tmp_path / "record"
    folder.mkdir()
    record.mkdir()
    two_nodes.names_resolve(True)
    endpoint = (two_nodes.nodes[0], 29500)  # nothing else listens in a namespace of the tier's own
    kill = ["--trainer.callbacks+=tests.recorder.KillAfterCheckpoint", "--trainer.callbacks.rank=3",
            "--trainer.callbacks.steps_after=1"]
    commands = []
    for node in two_nodes.nodes:
        env, argv = torchrun_recipe(MULTI_NODE, TASKS_PER_NODE, f"{endpoint[0]}:{endpoint[1]}",
                                    [*SEEDED, "--epochs", str(EPOCHS), "--data_dir", str(fashion_root), *kill])
        env = clean_env({**env, "SAMPLE_RECORD_DIR": str(record)})  # the host name resolves to the node's address
        commands.append((node, argv, env))
    logs = tmp_path / "logs"
    jobs = []
    try:
        for node, argv, env in commands:
            jobs.append(start(node, argv, folder, logs, env, prefix=two_nodes.on_host(node)))
            if len(jobs) == 1:  # the first agent hosts the c10d store (its host name is the endpoint's)
                wait_for(node_addr(0), endpoint[1], jobs[0])
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all(job.exited() for job in jobs) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = running_in(folder)
    finally:
        problem = wait_all(jobs, 1)  # stops (SIGTERM, then SIGKILL) whatever still runs
    assert problem is None, problem
    assert left == [], f"processes left running: {left}"
    tails = "\n".join(job.tail(4000) for job in jobs)
    assert [job.returncode for job in jobs] == [0, 0], tails
    assert (record / "killed-0").exists(), "the worker was not killed"
    newest = max(record.glob("attempt-*.json"), key=lambda p: p.stat().st_mtime)
    assert json.loads(newest.read_text())["start_step"] == STEPS_PER_EPOCH, tails  # resumed from epoch 1's
    ranks = where(record)  # the attempt that finished (each attempt rewrites them)
    inodes = {net_namespace_inode(node): node for node in two_nodes.nodes}
    assert sorted(inodes[seen["net_ns"]] for seen in ranks) == sorted(two_nodes.nodes * TASKS_PER_NODE), ranks
    assert {(seen["environment"], seen["world_size"]) for seen in ranks} == {("TorchElasticEnvironment", WORLD)}
    # Not bitwise: with 4 ranks the restarted group's weights differ from the clean run's by rounding (up to 3e-8
    # here; the same group left alone ends bitwise equal). Likely cause, not proven: gloo's ring all-reduce adds each
    # gradient element in an order set by DDP's bucket layout, which each new process builds again after its first
    # step; with 2 ranks (tests/cluster/test_torchrun.py) the order cannot change a sum.
    restarted = final_checkpoint(folder)
    assert restarted["global_step"] == one_host["global_step"] == EPOCHS * STEPS_PER_EPOCH
    for key, value in one_host["state_dict"].items():
        assert torch.allclose(value, restarted["state_dict"][key], rtol=0, atol=1e-6), key


def wait_for(host: str, port: int, job, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline and not job.exited(), job.tail()
            time.sleep(0.1)


def test_what_an_interrupted_run_left_is_removed_when_the_cluster_starts(two_nodes):
    """A run killed before its cleanup leaves namespaces, links and processes in them: the next start removes them
    (here: the cluster stopped, a stale namespace with a process in it and a stale veth pair, then started again)."""
    two_nodes.stop()
    stale = f"{PREFIX}-stale"
    sleeper = None
    try:
        subprocess.run(["ip", "netns", "add", stale], check=True, timeout=30)
        subprocess.run(["ip", "link", "add", f"{PREFIX}v9", "type", "veth", "peer", "name", f"{PREFIX}p9"],
                       check=True, timeout=30)
        sleeper = subprocess.Popen(["nsenter", f"--net=/var/run/netns/{stale}", "sleep", "600"])
        deadline = time.monotonic() + 10
        while sleeper.pid not in namespace_pids(stale):
            assert time.monotonic() < deadline, "the stale process never entered its namespace"
            time.sleep(0.1)
    finally:
        two_nodes.start()  # also when making the leftovers failed: the tests after this one need the cluster
    assert sleeper.wait(timeout=10) == -9  # SIGKILLed by the start
    assert namespaces() == list(two_nodes.nodes)
    assert sorted(links()) == sorted([BRIDGE, f"{PREFIX}v0", f"{PREFIX}v1"])
    result = two_nodes.run("srun", "-N", "2", "--ntasks-per-node", "1", "hostname", timeout=60)
    assert result.returncode == 0, result.stderr
