"""``--num_nodes 2`` under torchrun: two "nodes" on 127.0.0.1, started as on two machines.

Each node is one ``python -m torch.distributed.run --nnodes 2 --node_rank N`` with its own
working directory holding its own copy of the data in ``./data`` (the default data dir), so
what a node writes and reads is its own. Static rendezvous: node 0's torchrun hosts the
store at --master_addr:--master_port, which the ranks' process group then joins.

What the files cannot separate: both "nodes" share /tmp. ModelCheckpoint broadcasts rank 0's
absolute checkpoint folder, so node 1 loads the best checkpoint for test-after-fit from node
0's folder; on real machines that folder must be on storage both nodes see.
"""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.launch import clean_env, free_port, start_all, wait_all
from tests.conftest import TRAIN_PY, experiment_dir, run_dir
from tests.test_training import epoch_lines

pytestmark = pytest.mark.multiprocess

NODES = 2
N_TRAIN, N_TEST = 256, 101  # the fashion_root fixture
TIMEOUT_S = 420


def launch_nodes(base: Path, fashion_root: Path, nproc_per_node: int):
    """Start both nodes at once and wait for both; returns (jobs, record dir, master port)."""
    record = base / "record"
    record.mkdir()
    port = free_port()
    commands = []
    for node in range(NODES):
        cwd = base / f"node{node}"
        shutil.copytree(fashion_root, cwd / "data")
        argv = ["-m", "torch.distributed.run", "--nnodes", str(NODES), "--nproc_per_node", str(nproc_per_node),
                "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
                str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", str(nproc_per_node),
                "--num_nodes", str(NODES), "--epochs", "2", "--batch_size", "32",
                "--trainer.callbacks+=tests.recorder.SampleRecorder",
                "--trainer.callbacks+=tests.recorder.PrepareDataRecorder"]
        commands.append((f"node{node}", argv, cwd, clean_env({"SAMPLE_RECORD_DIR": str(record)})))
    jobs = start_all(commands, base / "logs")
    timed_out = wait_all(jobs, TIMEOUT_S)
    assert timed_out is None, timed_out
    return jobs, record, port


@pytest.fixture(scope="module", params=[1, 2], ids=["2x1", "2x2"])
def nodes(request, tmp_path_factory, fashion_root):
    """Two nodes × ``param`` CPU processes each."""
    nproc = request.param
    jobs, record, port = launch_nodes(tmp_path_factory.mktemp(f"nodes{nproc}"), fashion_root, nproc)
    return nproc, jobs, record, port


def test_training_finishes_on_both_nodes(nodes):
    nproc, jobs, _, _ = nodes
    assert [job.returncode for job in jobs] == [0, 0], "\n".join(job.tail() for job in jobs)
    world = NODES * nproc
    log = jobs[0].stdout + jobs[0].stderr
    assert f"world size      : {world} ({nproc} device(s) x {NODES} node(s), cpu, strategy ddp, backend gloo)" in log
    assert f"32 per device x {nproc} x {NODES} x accumulate 1 = effective {32 * world}" in log


def test_ranks_train_on_disjoint_shards_and_validate_each_image_once(nodes):
    nproc, _, record, port = nodes
    world = NODES * nproc
    ranks = [json.loads((record / f"rank{r}.json").read_text()) for r in range(world)]
    assert [(r["world_size"], r["main_port"]) for r in ranks] == [(world, port)] * world  # one group, torchrun's
    for epoch in ("0", "1"):
        shards = [r["train"][epoch] for r in ranks]
        assert [len(s) for s in shards] == [N_TRAIN // world] * world
        assert sorted(sum(shards, [])) == list(range(N_TRAIN))  # disjoint, and together the whole split
    assert {len(r["val"]) for r in ranks} == {4}  # twice an epoch (configs/default.yaml)
    for passes in zip(*(r["val"] for r in ranks)):
        assert sorted(sum(passes, [])) == list(range(N_TEST))  # each validation sees every image once
    assert ranks[-1]["train"]["0"] != ranks[-1]["train"]["1"]  # reshuffled every epoch, on node 1 too


def test_only_global_rank0_prints_and_writes_logs_and_checkpoints(nodes):
    _, (node0, node1), _, _ = nodes
    assert [m.epoch for m in epoch_lines(node0.stdout)] == [1, 2]
    assert epoch_lines(node1.stdout) == []
    assert (node0.stdout + node0.stderr).count("Run configuration") == 1
    assert "Run configuration" not in node1.stdout + node1.stderr
    assert sorted(p.name for p in node1.cwd.iterdir()) == ["data"]  # no runs/, lightning_logs/, checkpoints
    assert len(list(experiment_dir(node0.cwd).iterdir())) == 1
    run = run_dir(node0.cwd)
    assert list(run.glob("events.out.tfevents.*"))
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))
    assert "last.ckpt" in checkpoints and any(name.startswith("best-") for name in checkpoints), checkpoints


def test_each_nodes_local_rank0_alone_prepares_that_nodes_own_data(nodes):
    """train.py checks the files before fit (``cli``), Lightning calls prepare_data in fit and in the test after it."""
    nproc, (node0, node1), record, _ = nodes
    calls = {int(p.stem.removeprefix("prepare_data-rank")): [json.loads(line) for line in p.read_text().splitlines()]
             for p in record.glob("prepare_data-rank*.jsonl")}
    assert sorted(calls) == [0, nproc]  # global rank of local rank 0 on node 0 and on node 1
    for node, job in enumerate((node0, node1)):
        entries = calls[node * nproc]
        assert [e["caller"] for e in entries] == ["cli", "lightning:fit", "lightning:test"]
        assert {(e["node_rank"], e["local_rank"]) for e in entries} == {(node, 0)}
        assert len({e["pid"] for e in entries}) == 1  # the rank itself, not a launcher
        own = str((job.cwd / "data" / "FashionMNIST" / "raw").resolve())
        assert [(e["raw_folder"], e["missing"]) for e in entries] == [(own, [])] * 3  # found its own files
