"""Process lifetime without processes: the collective timeout from the environment, on every ddp/fsdp name; each
fault of the job recognised by its message, and nothing else; what a torchrun worker reads from its variables;
which srun step a failing task signals (the signal itself: tests/cluster/test_slurm.py)."""

import signal
from datetime import timedelta

import pytest
from lightning.pytorch.strategies import StrategyRegistry

from fashion_mnist_dp.runtime.faults import LOST, STUCK, describe_fault, fault_of
from fashion_mnist_dp.runtime.lifetime import (
    DEFAULT_TIMEOUT_S,
    DISABLE_SHARED_STORE,
    TIMEOUT_ENV,
    attempt,
    collective_timeout,
    configured_timeout,
    max_restarts,
    set_collective_timeout,
    shared_store_warning,
)
from fashion_mnist_dp.runtime.signals import PEER_FAILED, end_peer_tasks, srun_step
from fashion_mnist_dp.strategies import register_strategies

# torch 2.14's messages for these faults (gloo, TCPStore), as the ranks above saw them.
FAULTS = {
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv "
    "operation to complete": "rank 3 timed out after 20 s waiting for the other ranks in a collective",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:40123": "rank 3 lost its connection to another rank in a collective",
    "DistNetworkError: The server socket has failed to listen on any local network address. port: 29877, useIpv6: "
    "false, code: -98, name: EADDRINUSE, message: address already in use": "rank 3: MASTER_PORT 29877 is already in use",
    "DistStoreError: Timed out after 21 seconds waiting for clients. 1/2 clients joined.":
        "rank 3 waited 21 s for the other ranks to join, and only 1 of 2 did",
    "DistNetworkError: The client socket has timed out after 20000ms while trying to connect to (127.0.0.1, 29901).":
        "rank 3 could not reach rank 0 at 127.0.0.1:29901 within 20 s",
    "RuntimeError: DataLoader timed out after 10.0 seconds": "rank 3: a data loader worker delivered no batch for 10 s",
    "RuntimeError: bind failed: address already in use": "rank 3: MASTER_PORT is already in use on this machine (",
    "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] Connection "
    "reset by peer [127.0.0.1]:54321": "rank 3 could not connect to the other ranks (gloo: [../third_party/gloo/gloo/"
    "transport/tcp/pair.cc:144] Connection reset by peer [127.0.0.1]:54321): across hosts, set GLOO_SOCKET_IFNAME",
    "RuntimeError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=300000) ran for 300012 milliseconds before timing out.":
        "rank 3 timed out after 300 s waiting for the other ranks in a collective (a rank is stuck or was lost: the "
        "hang report below says which, and where); resume with --ckpt_path last, or raise --collective_timeout (now ",
}


def test_the_timeout_comes_from_the_environment_with_a_5_minute_default():
    assert collective_timeout({}) == timedelta(seconds=DEFAULT_TIMEOUT_S) == timedelta(minutes=5)
    assert collective_timeout({TIMEOUT_ENV: "20"}) == timedelta(seconds=20)
    for bad in ("0", "-1", "abc", "inf", "nan"):
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            collective_timeout({TIMEOUT_ENV: bad})
        with pytest.raises(ValueError, match="collective_timeout must be a number of seconds > 0"):
            collective_timeout({}, seconds=float(bad) if bad != "abc" else -1.0)


def test_the_config_key_wins_over_the_environment_and_reaches_the_fault_lines():
    assert collective_timeout({TIMEOUT_ENV: "20"}, seconds=45) == timedelta(seconds=45)
    try:
        set_collective_timeout(timedelta(seconds=45))
        assert configured_timeout() == timedelta(seconds=45)
        fault = RuntimeError("Timed out waiting 45000ms for recv operation")
        assert "--collective_timeout (now 45 s)" in describe_fault(fault)
    finally:
        set_collective_timeout(timedelta(seconds=DEFAULT_TIMEOUT_S))


def test_every_ddp_and_fsdp_strategy_name_gets_the_timeout(monkeypatch):
    register_strategies()
    monkeypatch.setenv(TIMEOUT_ENV, "20")
    try:
        set_collective_timeout(collective_timeout())
        for name in ("ddp", "ddp_spawn", "fsdp", "fsdp_cpu"):
            assert StrategyRegistry.get(name)._timeout == timedelta(seconds=20), name
    finally:
        set_collective_timeout(timedelta(seconds=DEFAULT_TIMEOUT_S))


def raised(message: str):
    """The exception class a rank saw for ``message`` (``Kind: text``), and the text."""
    import torch.distributed as dist

    kind, text = message.split(": ", 1)
    kinds = {"DistNetworkError": dist.DistNetworkError, "DistStoreError": dist.DistStoreError}
    return kinds.get(kind, RuntimeError), text


@pytest.mark.parametrize("message", list(FAULTS))
def test_each_fault_of_the_job_is_recognised_and_nothing_else(message):
    error, text = raised(message)
    assert describe_fault(error(text), rank=3).startswith(FAULTS[message])
    assert describe_fault(RuntimeError("CUDA out of memory"), rank=3) is None
    assert describe_fault(ValueError(text), rank=3) is None  # only torch's RuntimeError and its DistError kinds


@pytest.mark.parametrize("message", list(FAULTS))
def test_the_hang_report_follows_only_a_stuck_or_lost_collective(message):
    """The report is about the fault the rank's line names: a gloo connect failure whose detail says the peer reset
    the connection is no hang, and asks no rank where it is."""
    error, text = raised(message)
    hang = FAULTS[message].startswith(("rank 3 timed out after", "rank 3 lost its connection"))
    assert (fault_of(error(text)) in (STUCK, LOST)) == hang


def test_what_a_worker_reads_from_torchruns_variables():
    assert (max_restarts({}), attempt({})) == (0, 1)
    env = {"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert (max_restarts(env), attempt(env)) == (3, 3)
    assert DISABLE_SHARED_STORE + "=1" in shared_store_warning(env)
    assert shared_store_warning({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None  # the variable was set
    assert shared_store_warning({**env, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None  # no restarts asked for




def test_only_a_task_of_a_several_task_srun_step_has_a_step_to_signal(monkeypatch):
    task = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}
    assert srun_step(task) == "41.0"
    assert srun_step({**task, "SLURM_STEP_NUM_TASKS": "1"}) is None  # alone in its step: no peer waits for it
    assert srun_step({k: v for k, v in task.items() if k != "SLURM_STEP_ID"}) is None  # the batch script itself
    assert srun_step({**task, "SLURM_JOB_ID": "41; rm -rf /"}) is None  # only ids go to scancel
    assert srun_step({}) is None
    monkeypatch.setenv("PATH", "/nonexistent")  # outside srun scancel is never run; under srun, a missing one is fine
    assert end_peer_tasks({}) is None


def test_under_srun_a_failing_task_signals_its_step_and_a_missing_scancel_is_no_error(monkeypatch, tmp_path):
    task = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}
    previous = signal.getsignal(PEER_FAILED)
    try:
        calls = tmp_path / "calls"
        scancel = tmp_path / "scancel"
        scancel.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
        scancel.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        assert end_peer_tasks(task) == "41.0"
        assert calls.read_text().splitlines() == ["--quiet --signal=USR2 41.0"]
        assert signal.getsignal(PEER_FAILED) is signal.SIG_IGN  # the failing task does not end itself by it
        monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))  # scancel missing under srun: None, no error
        assert end_peer_tasks(task) is None
    finally:
        signal.signal(PEER_FAILED, previous)
