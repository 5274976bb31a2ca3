"""The hang report's parts (fashion_mnist_dp/runtime/hangs.py): where a rank is, in the project's and the user's
code; its step and stage; how a rank ended; the report's lines when no other rank can answer; NCCL's flight
recorder settings. Whole jobs that hang: tests/test_lifetime.py and the cluster tier."""

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from types import SimpleNamespace

import pytest
import torch

from fashion_mnist_dp.cli import app as train
from fashion_mnist_dp.cli.slurm import rendezvous_environment_problem
from fashion_mnist_dp.runtime import hangs, lifetime

LIBRARY = hangs._LIBRARIES[-1]  # an installed library's folder (site-packages)


def frame(path: str, line: int, name: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(path, line, name)


def trainer(step: int = 12, stage: str = "train", rank: int = 0) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, global_rank=rank, state=SimpleNamespace(stage=SimpleNamespace(value=stage)))


def test_where_a_rank_is_names_its_innermost_frames_in_the_projects_and_the_users_code():
    stack = [frame(f"{hangs.PROJECT}/train.py", 38, "<module>"), frame(f"{LIBRARY}/lightning/loop.py", 10, "run"),
             frame("/home/me/my_callbacks.py", 7, "on_train_batch_end"), frame(f"{LIBRARY}/torch/x.py", 3, "wait")]
    assert hangs.shown(stack) == ["/home/me/my_callbacks.py:7 on_train_batch_end", "train.py:38 <module>"]
    library_only = [frame(f"{LIBRARY}/torch/distributed/c10d.py", 99, "barrier")]
    assert hangs.shown(library_only) == ["torch/distributed/c10d.py:99 barrier"]  # nothing of ours: the innermost


@pytest.mark.parametrize("names, stage, expected", [
    (["training_step"], "train", "optimizer step 12 (training step)"),
    (["validation_step"], "validate", "optimizer step 12 (validation)"),
    (["on_train_epoch_end", "save_checkpoint"], "train", "optimizer step 12 (checkpoint save)"),
    (["setup_environment"], "train", "optimizer step 12 (set-up)"),
    ([], None, "optimizer step 12 (set-up)"),
])
def test_a_ranks_position_is_its_step_and_the_stage_its_stack_and_trainer_show(names, stage, expected):
    assert hangs.position(trainer(stage=stage), [frame("/x.py", 1, name) for name in names]) == expected


def test_a_rank_that_ended_is_named_by_its_code_or_its_signal():
    assert hangs.ended(-signal.SIGKILL) == "was killed by SIGKILL" and hangs.ended(75) == "exited with code 75"
    assert hangs.join_report(2, 1, {}, []) == [
        "hang report: only this rank joined; rank 1 never reached MASTER_ADDR:MASTER_PORT"]
    assert hangs.join_report(3, 1, {2: 65}, [1]) == [
        "hang report: rank 2 exited with code 65 before it joined",
        "hang report: rank 1 is running but did not join (still starting, or stuck before the rendezvous)"]


def test_without_a_store_the_report_names_the_others_by_the_last_decision_point(tmp_path, monkeypatch):
    """The store's host stopped (or no store): the rank that saw the fault reports what it knows itself."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    try:
        raise RuntimeError("Timed out waiting 20000ms for recv operation")
    except RuntimeError as error:
        fault = error
    lines = hangs.report(trainer(rank=0), fault, 3, "optimizer step 10 (training step)", str(tmp_path),
                         exited={2: -signal.SIGKILL})
    assert lines[0].startswith("hang report: rank 0 timed out waiting: at optimizer step 12 (training step), in ")
    assert lines[1:3] == [
        "hang report: rank 1 did not answer (stopped, dead, or stuck outside Python): the last decision point every "
        "rank passed was optimizer step 10 (training step)",
        "hang report: rank 2 was killed by SIGKILL: the last decision point every rank passed was optimizer step 10 "
        "(training step)"]
    (stacks,) = tmp_path.glob("hang-*.txt")
    assert lines[3] == f"hang report: every thread's stack of every rank that answered: {stacks}"
    text = stacks.read_text()
    assert "=== rank 0 " in text and "Where it saw the fault" in text and "test_hangs.py" in text


def a_lost_peer() -> RuntimeError:
    try:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:41234")
    except RuntimeError as error:
        return error


@pytest.mark.parametrize("silent", [False, True], ids=["the others answered", "two live ranks silent"])
def test_a_rank_whose_process_on_this_host_ended_is_named_at_once_not_waited_for(tmp_path, monkeypatch, silent):
    """Each rank's watch tells the store its kernel and pid at set-up. A rank whose process on this host has ended
    (here a zombie, as a launcher's child is until reaped) cannot answer: the report names it without waiting out
    ANSWER_WAIT_S (under torchrun, every restart after a lost rank began 10 s later), and still waits for a rank
    alive on this host, or on another host (where a pid says nothing here), that does not answer."""
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(hangs, "ANSWER_WAIT_S", 2.0)
    killed, alive = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    killed.kill()
    try:
        client = hangs.store()
        client.set("pid1", json.dumps([lifetime.kernel(), killed.pid]))
        client.set("pid2", json.dumps([lifetime.kernel(), alive.pid]))
        client.set("pid3", json.dumps(["another host", killed.pid]))
        for rank in [] if silent else [2, 3]:
            client.set(f"rank{rank}", json.dumps(hangs.answer(trainer(rank=rank), rank)))
        started = time.monotonic()
        lines = hangs.report(trainer(rank=0), a_lost_peer(), 4, "optimizer step 8 (epoch end)", str(tmp_path))
        took = time.monotonic() - started
    finally:
        alive.kill()
        killed.wait(), alive.wait()
    assert lines[1] == (f"hang report: rank 1 did not answer (its process, pid {killed.pid} on this host, has ended): "
                        "the last decision point every rank passed was optimizer step 8 (epoch end)")
    how = "did not answer (stopped, dead, or stuck outside Python)" if silent else "did not arrive"
    assert [line.startswith(f"hang report: rank {rank} {how}") for rank, line in zip([2, 3], lines[2:4])] == [True] * 2
    assert took >= 2.0 if silent else took < 1.0


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_in_a_pid_namespace_whose_proc_is_another_namespaces_no_pid_is_compared():
    """Under ``unshare --pid`` without its own /proc, a pid in /proc is another process's: no kernel to compare."""
    code = ("import os\nfrom pathlib import Path\nfrom typing import Optional\n"
            f"{inspect.getsource(lifetime.kernel)}\nprint(kernel())")

    def kernel_in(*flags: str) -> str:
        argv = ["unshare", "--pid", "--fork", *flags, sys.executable, "-c", code]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout.strip()

    assert lifetime.kernel() is not None and kernel_in() == "None"
    assert kernel_in("--mount-proc") not in ("None", lifetime.kernel())  # its own namespace, seen in its own /proc


def test_nccls_flight_recorder_is_on_with_a_bounded_buffer_under_both_names_and_dumps_into_the_folder(tmp_path):
    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}  # what a user set stays
    line = hangs.flight_recorder(tmp_path, environ)
    assert environ == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "64", "TORCH_FR_BUFFER_SIZE": "2000",
                       "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl-trace-rank"),
                       "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "nccl-trace-rank")}
    assert line == (f"  flight recorder : NCCL's, 2000 collectives a rank, dumped on a timeout to "
                    f"{tmp_path}/nccl-trace-rank<rank> (python -m torch.distributed.flight_recorder.fr_trace "
                    f"{tmp_path} --prefix nccl-trace-rank)")


@pytest.mark.parametrize("environ, expected", [
    ({"MASTER_PORT": "99999"}, ("MASTER_PORT is '99999': give a TCP port from 1 to 65535", False)),
    ({"MASTER_PORT": "abc"}, ("MASTER_PORT is 'abc': give a TCP port from 1 to 65535", False)),
    ({"MASTER_PORT": "0"}, ("MASTER_PORT is '0'", False)),
    ({"MASTER_ADDR": ""}, ("MASTER_ADDR is set but empty", False)),
    ({"GLOO_SOCKET_IFNAME": "nosuch0"}, ("GLOO_SOCKET_IFNAME is 'nosuch0', but this host has no interface nosuch0", True)),
    ({"GLOO_SOCKET_IFNAME": "lo", "MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1"}, None),
])
def test_the_rendezvous_variables_are_checked_before_any_rank_starts(environ, expected):
    problem = rendezvous_environment_problem(environ, gloo=True)
    assert problem is None if expected is None else (problem[0].startswith(expected[0]) and problem[1] == expected[1])


def test_an_interface_without_an_address_is_refused_for_gloo_only(monkeypatch):
    monkeypatch.setattr("fashion_mnist_dp.cli.slurm.interface_addresses", lambda name: [])
    line, network = rendezvous_environment_problem({"GLOO_SOCKET_IFNAME": "lo"}, gloo=True)
    assert network and line.startswith("GLOO_SOCKET_IFNAME is 'lo', but interface lo has no address here")
    assert rendezvous_environment_problem({"GLOO_SOCKET_IFNAME": "nosuch0"}, gloo=False) is None  # NCCL's run


@pytest.mark.parametrize("name, value, code", [("MASTER_PORT", "99999", 2), ("MASTER_PORT", "abc", 2),
                                               ("MASTER_ADDR", "", 2), ("GLOO_SOCKET_IFNAME", "nosuch0", 75)])
def test_a_bad_rendezvous_variable_is_one_line_and_its_code_before_anything_runs(capsys, workdir, fashion_root,
                                                                                  monkeypatch, name, value, code):
    monkeypatch.setenv(name, value)
    assert train.main(["--data_dir", str(fashion_root), "--strategy", "ddp", "--accelerator", "cpu",
                       "--devices", "2"]) == code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert len(lines) == 1 and f"{name} is {value!r}" in lines[0] or f"{name} is set but empty" in lines[0], err
    assert "Traceback" not in err and not (workdir / "runs").exists()
