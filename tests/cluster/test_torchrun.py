"""docs/running-on-clusters.md's torchrun recipes, run as written on 127.0.0.1 (CPU and gloo, one process per "node"
for the multi-node lines): real torchrun agents with the c10d rendezvous, a worker SIGKILLed mid-epoch, the group
restarted and resumed from last.ckpt to exactly a clean run's weights; with ``--max-restarts 0`` the job ends.

Every job trains the mlp on the tiny data seeded and deterministic: 2 ranks x batch 32 = 4 optimizer steps per
epoch. The fault: rank 1 SIGKILLs itself 2 steps after the first epoch's checkpoint
(tests.recorder.KillAfterCheckpoint).
"""

import json
import re
import socket
import time
from pathlib import Path
from typing import Dict, List

import pytest

from benchmarks.launch import clean_env, free_port, running_in, start_all, wait_all
from tests.cluster.recipes import (SEEDED, STEPS_PER_EPOCH, assert_same_weights, final_checkpoint,
                                   torchrun_recipe)

EPOCHS = 3
KILL = ["--trainer.callbacks+=tests.recorder.KillAfterCheckpoint"]
MULTI_NODE = "--rdzv-backend c10d"  # the line of the document each test runs, by a phrase only it holds
ONE_NODE = "torchrun --nproc-per-node"
STATIC = "--node_rank 0"
TIMEOUT_S = 240


def run_agents(folder: Path, marker: str, nodes: int, nproc: int, extra: List[str], **replace: str):
    """Start ``nodes`` torchrun agents of the document's line (each its own ``--node_rank`` when the line has one),
    all in ``folder`` (the shared storage the document asks for); wait for all. Returns (jobs, record folder, the
    time.time() they all had exited)."""
    record = folder / "record"
    record.mkdir(parents=True)
    endpoint = f"127.0.0.1:{free_port()}"
    commands = []
    for node in range(nodes):
        node_rank = {"node_rank": str(node)} if marker == STATIC else {}
        env, argv = torchrun_recipe(marker, nproc, endpoint, [*SEEDED, "--epochs", str(EPOCHS), *extra],
                                    **replace, **node_rank)
        commands.append((f"agent{node}", argv, folder, clean_env({**env, "SAMPLE_RECORD_DIR": str(record)})))
    logs = folder.parent / f"{folder.name}-logs"
    jobs = start_all(commands[:1], logs)
    if len(commands) > 1 and marker == MULTI_NODE:  # agent 0 hosts the c10d store: it binds the port first
        wait_for_port(int(endpoint.rsplit(":", 1)[1]), jobs[0])
    jobs += start_all(commands[1:], logs) if len(commands) > 1 else []
    deadline = time.monotonic() + TIMEOUT_S
    while not all(job.exited() for job in jobs) and time.monotonic() < deadline:
        time.sleep(0.1)
    ended = time.time()
    left = running_in(folder)
    problem = wait_all(jobs, 1)
    assert problem is None, problem
    assert left == [], f"processes left running: {left}"
    return jobs, record, ended


def wait_for_port(port: int, job, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline and not job.exited(), job.tail()
            time.sleep(0.1)


def tails(jobs) -> str:
    return "\n".join(job.tail(4000) for job in jobs)


@pytest.fixture(scope="module")
def clean_run(fashion_root, tmp_path_factory) -> Dict:
    """The multi-node c10d line, two agents, nothing killed."""
    folder = tmp_path_factory.mktemp("clean")
    jobs, _, _ = run_agents(folder, MULTI_NODE, 2, 1, ["--data_dir", str(fashion_root)])
    assert [job.returncode for job in jobs] == [0, 0], tails(jobs)
    return final_checkpoint(folder)


def test_two_agents_restart_a_lost_worker_resume_from_last_ckpt_and_end_as_a_clean_run(clean_run, fashion_root,
                                                                                      tmp_path):
    folder = tmp_path / "job"
    jobs, record, _ = run_agents(folder, MULTI_NODE, 2, 1, ["--data_dir", str(fashion_root), *KILL])
    assert [job.returncode for job in jobs] == [0, 0], tails(jobs)
    assert (record / "killed-0").exists(), "the worker was not killed"
    # Rank 0's agent restarts its worker for the new rendezvous round without counting a restart (its
    # TORCHELASTIC_RESTART_COUNT stays 0): the newest record is the attempt that finished.
    newest = max(record.glob("attempt-*.json"), key=lambda p: p.stat().st_mtime)
    assert json.loads(newest.read_text())["start_step"] == STEPS_PER_EPOCH  # resumed from epoch 1's checkpoint
    assert "".join(job.stderr for job in jobs).count("Restored all states from the checkpoint") == 1  # rank 0 says
    assert_same_weights(clean_run, final_checkpoint(folder), EPOCHS * STEPS_PER_EPOCH)


def test_one_node_restart_line_resumes_and_ends_as_a_clean_run(clean_run, fashion_root, tmp_path):
    folder = tmp_path / "job"
    jobs, record, _ = run_agents(folder, ONE_NODE, 1, 2, ["--data_dir", str(fashion_root), *KILL])
    assert [job.returncode for job in jobs] == [0], tails(jobs)
    assert (record / "killed-0").exists() and (record / "attempt-1.json").exists(), tails(jobs)
    # The restart resumed from epoch 1's last.ckpt, not from scratch (a seeded, deterministic retrain would also
    # end with the same weights)
    assert json.loads((record / "attempt-1.json").read_text())["start_step"] == STEPS_PER_EPOCH, tails(jobs)
    assert jobs[0].stderr.count("Restored all states from the checkpoint") == 1, tails(jobs)
    # 2 ranks on one node, or on two: the same run
    assert_same_weights(clean_run, final_checkpoint(folder), EPOCHS * STEPS_PER_EPOCH)


def test_static_two_node_line_trains(fashion_root, tmp_path):
    jobs, _, _ = run_agents(tmp_path / "job", STATIC, 2, 1, ["--data_dir", str(fashion_root)])
    assert [job.returncode for job in jobs] == [0, 0], tails(jobs)
    assert final_checkpoint(tmp_path / "job")["global_step"] == EPOCHS * STEPS_PER_EPOCH


def test_without_restarts_a_lost_worker_ends_both_agents_with_one_line(fashion_root, tmp_path):
    folder = tmp_path / "job"
    # No restart may come, so --ckpt_path last with nothing saved would be refused (exit 66): a new run instead.
    jobs, record, ended = run_agents(folder, MULTI_NODE, 2, 1, ["--data_dir", str(fashion_root), *KILL],
                                     max_restarts="0", ckpt_path="null")
    seconds = ended - (record / "killed-0").stat().st_mtime
    print(f"\ntorchrun --max-restarts 0, 2 agents, a worker SIGKILLed: both agents ended {seconds:.1f} s after it")
    assert [job.returncode for job in jobs] == [1, 1], tails(jobs)  # torchrun's code after its ChildFailedError
    assert seconds < 60
    # The surviving worker says what happened in one line and exits 75, which its agent's report names (agent 0
    # hosts the c10d store here: an agent whose store host ended first would report the lost store instead).
    assert re.search(r"exitcode\s*:\s*75\b", jobs[0].stderr), tails(jobs)
    assert re.search(r"exitcode\s*:\s*-9\b.*SIGKILL", jobs[1].stderr), tails(jobs)  # the killed worker
    lines = [line for line in jobs[0].stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(lines) == 1 and re.search(r"rank 0 lost its connection to another rank", lines[0]), tails(jobs)
    assert re.search(r"^train\.py: hang report: rank 1 did not answer .*: the last decision point every rank passed "
                     r"was optimizer step \d+", jobs[0].stderr, flags=re.M), tails(jobs)


def test_a_worker_stuck_in_python_is_named_with_its_step_and_where_under_torchrun(fashion_root, tmp_path):
    """The one-node line, no restarts: rank 1 stops in a callback at step 6; rank 0 times out, and the hang report
    names rank 1, its step and its function; the job ends within the collective timeout + 30 s of the hang."""
    folder = tmp_path / "job"
    jobs, record, ended = run_agents(folder, ONE_NODE, 1, 2, ["--data_dir", str(fashion_root), "--collective_timeout",
                                                              "20", "--trainer.callbacks+=tests.recorder.HangRank"],
                                     max_restarts="0", ckpt_path="null")
    seconds = ended - (record / "hung").stat().st_mtime
    print(f"\ntorchrun, rank 1 stuck in Python: the job ended {seconds:.1f} s after the hang")
    assert jobs[0].returncode == 1 and re.search(r"exitcode\s*:\s*75\b", jobs[0].stderr), tails(jobs)
    assert seconds < 20 + 30  # the collective timeout, then the report (its wait for answers is 10 s at most)
    assert re.search(r"^train\.py: hang report: rank 1 did not arrive: at optimizer step 6 \(training step\), in "
                     r"tests/recorder\.py:\d+ on_train_batch_end", jobs[0].stderr, flags=re.M), tails(jobs)
    assert "Traceback" not in "".join(line for line in jobs[0].stderr.splitlines(True) if "train.py" in line)


def test_a_flag_the_documents_line_no_longer_has_fails_the_recipe_instead_of_being_ignored():
    _, argv = torchrun_recipe(MULTI_NODE, 1, "127.0.0.1:1234", [], max_restarts="0", ckpt_path="null")
    assert argv[argv.index("--max-restarts") + 1] == "0" and argv[argv.index("--ckpt_path") + 1] == "null"
    with pytest.raises(AssertionError, match="no --node_rank in"):
        torchrun_recipe(MULTI_NODE, 1, "127.0.0.1:1234", [], node_rank="1")
