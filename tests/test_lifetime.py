"""No unbounded hang: a lost or stuck rank, a stalled data worker, a busy port or a peer that never joins ends the
whole job within the collective timeout + 30 s, with one line and exit 75 from the rank that saw it, and ranks die
with their launcher. The jobs here run with FASHION_MNIST_COLLECTIVE_TIMEOUT=20 (the default is 300 s)."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import launch
from benchmarks.launch import (
    REPO,
    TRAIN_PY,
    _alive,
    clean_env,
    free_port,
    process_tree,
    running_in,
    start_all,
    wait_all,
)
from fashion_mnist_dp.runtime.checkpoint_io import verify
from fashion_mnist_dp.runtime.lifetime import LAUNCHER_PID_ENV, TIMEOUT_ENV
from fashion_mnist_dp.runtime.signals import die_with_parent
from tests.conftest import run_train
from tests.test_preemption import argv, start_launcher

TEST_TIMEOUT_S = 20
BOUND_S = TEST_TIMEOUT_S + 30
TIMEOUT_S = 150
TEMPFAIL = 75
GONE_S = 10  # after the job's exit, every process of it (ranks, data workers) is gone within this


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("train.py: error:")]


def report_lines(stderr: str) -> list:
    """The hang report: the lines after the fault's own (fashion_mnist_dp/runtime/hangs.py)."""
    return [line.removeprefix("train.py: hang report: ") for line in stderr.splitlines()
            if line.startswith("train.py: hang report: ")]


def stacks_file(report: list, cwd: Path) -> str:
    """The file the report's last line names: in the run's folder, every answering rank's stacks."""
    path = Path(report[-1].rpartition(": ")[2])
    path = path if path.is_absolute() else cwd / path
    assert path.parent.parent.parent == cwd / "runs" and path.name.startswith("hang-"), path
    return path.read_text()


def assert_nothing_left(cwd: Path, since: float) -> None:
    while running_in(cwd) and time.monotonic() - since < GONE_S:
        time.sleep(0.1)
    assert running_in(cwd) == [], f"still running {GONE_S} s after the job ended: {running_in(cwd)}"






def test_a_rank_whose_launcher_is_already_gone_exits_at_once():
    """A rank that Lightning's launcher started checks that its parent is still that train.py when it asks to die
    with it: a launcher that failed while the rank was still importing torch would otherwise leave it running until
    its rendezvous timed out (5 minutes by default). Forked children stand in for the rank."""
    cases = ((os.getpid(), {}, 0), (1, {}, 128 + signal.SIGKILL),  # 1: not this child's parent
             (1, {"TORCHELASTIC_RUN_ID": "x"}, 0))  # torchrun's ranks: their agent is the parent, whatever it says
    for launcher, extra, expected in cases:
        pid = os.fork()
        if pid == 0:
            try:
                die_with_parent({"LOCAL_RANK": "1", LAUNCHER_PID_ENV: str(launcher), **extra})
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == expected, launcher


def start_job(tmp_path, fashion_root, *extra):
    """A 2-rank ddp launch at step 6; its pid and rank 1's."""
    job = start_launcher(tmp_path, fashion_root, {TIMEOUT_ENV: str(TEST_TIMEOUT_S)}, extra)
    ranks = {pid for pid, _ in process_tree(job.proc.pid)} - {job.proc.pid}
    assert len(ranks) == 1, ranks  # Lightning's launcher started rank 1 from rank 0
    return job, ranks.pop()


def wait_gone(tmp_path, started: float, bound_s: float) -> float:
    while running_in(tmp_path) and time.monotonic() - started < bound_s:
        time.sleep(0.1)
    return time.monotonic() - started


@pytest.mark.multiprocess
def test_kill_9_of_rank_1_ends_the_job_non_zero_within_the_bound(tmp_path, fashion_root):
    job, rank1 = start_job(tmp_path, fashion_root)
    killed = time.monotonic()
    os.kill(rank1, signal.SIGKILL)
    timed_out = wait_all([job], BOUND_S)
    took = time.monotonic() - killed
    assert timed_out is None, timed_out
    assert job.returncode != 0 and took < BOUND_S, (job.returncode, took)
    assert running_in(tmp_path) == []
    print(f"kill -9 rank 1 -> job exit {job.returncode} in {took:.1f} s")


@pytest.mark.multiprocess
def test_kill_9_of_the_launcher_takes_its_rank_with_it(tmp_path, fashion_root):
    job, rank1 = start_job(tmp_path, fashion_root)
    tree = process_tree(rank1)
    killed = time.monotonic()
    os.kill(job.proc.pid, signal.SIGKILL)
    took = wait_gone(tmp_path, killed, 10)
    assert not _alive(tree) and running_in(tmp_path) == [], f"rank 1 still running after {took:.1f} s"
    wait_all([job], 5)
    print(f"kill -9 launcher -> rank 1 gone in {took:.2f} s")


@pytest.mark.multiprocess
def test_a_stuck_rank_ends_the_job_within_the_collective_timeout_plus_30_s(tmp_path, fashion_root):
    """Rank 1 stops taking part (sleeps) after step 6; rank 0 waits in its next collective until the 20 s
    timeout, says so in one line, exits 75, and rank 1 dies with it (Lightning's default would wait 30 minutes).
    Checkpointing on exception is on: its save would wait in a barrier for rank 1 for another full timeout."""
    on_exception = tmp_path / "on_exception"
    job, _ = start_job(tmp_path, fashion_root, "--trainer.callbacks+=tests.recorder.HangRank",
                       "--trainer.callbacks+=lightning.pytorch.callbacks.OnExceptionCheckpoint",
                       f"--trainer.callbacks.dirpath={on_exception}")
    started = time.monotonic()
    timed_out = wait_all([job], BOUND_S + 10)
    took = time.monotonic() - started
    assert timed_out is None, timed_out
    # One bound, the guarantee's: load only lengthens a run. That it waited out the timeout is in its line below.
    assert job.returncode == TEMPFAIL and took < BOUND_S, (job.returncode, took, job.tail())
    lines = error_lines(job.stderr)
    assert lines == [f"train.py: error: rank 0 timed out after {TEST_TIMEOUT_S} s waiting for the other ranks in a "
                     f"collective (a rank is stuck or was lost: the hang report below says which, and where); resume "
                     f"with --ckpt_path last, or raise --collective_timeout (now {TEST_TIMEOUT_S} s) if a step or a "
                     f"checkpoint save can legitimately take longer"], job.tail()
    # Who hung: rank 1, at the step HangRank stopped it, in its hook; every rank's stacks in the run's folder
    report = report_lines(job.stderr)
    assert len(report) == 3 and report[0].startswith("rank 0 timed out waiting: at optimizer step "), job.tail()
    assert re.fullmatch(r"rank 1 did not arrive: at optimizer step 6 \(training step\), in tests/recorder\.py:\d+ "
                        r"on_train_batch_end(, .*)?", report[1]), report
    stacks = stacks_file(report, tmp_path)
    assert "=== rank 0 " in stacks and "=== rank 1 " in stacks and "time.sleep(3600)" in stacks, stacks[-3000:]
    assert "Traceback" not in job.stderr
    assert not on_exception.exists()  # the on-exception save was skipped, not waited for
    assert running_in(tmp_path) == []
    print(f"stuck rank 1 -> job exit {job.returncode} in {took:.1f} s")


@pytest.mark.multiprocess
def test_a_stopped_rank_is_named_with_the_last_decision_point_it_passed(tmp_path, fashion_root):
    """Rank 1 SIGSTOPped during training (as a kernel hang or a dead NFS mount would stop it): it cannot answer, so
    rank 0 names it as the one that did not, with the last decision point every rank passed; exit 75 within the
    bound, the last checkpoint intact."""
    job, rank1 = start_job(tmp_path, fashion_root, "--check_every_n_steps", "2")
    os.kill(rank1, signal.SIGSTOP)
    stopped = time.monotonic()
    timed_out = wait_all([job], BOUND_S + 10)
    took = time.monotonic() - stopped
    assert timed_out is None, timed_out
    assert job.returncode == TEMPFAIL and took < BOUND_S, (job.returncode, took, job.tail())  # the bound: the
    # collective timeout, then at most the report's wait (10 s) and the exit
    assert len(error_lines(job.stderr)) == 1 and "rank 0 timed out after" in error_lines(job.stderr)[0], job.tail()
    report = report_lines(job.stderr)
    assert re.fullmatch(r"rank 1 did not answer \(stopped, dead, or stuck outside Python\): the last decision point "
                        r"every rank passed was optimizer step (\d+) \(.+\)", report[1]), report
    assert int(re.search(r"step (\d+)", report[1])[1]) >= 6  # the marker came at step 6: it was training then
    assert "=== rank 0 " in stacks_file(report, tmp_path) and "Traceback" not in job.stderr
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    verify(last)  # the epoch-end checkpoint before the stop: intact
    assert_nothing_left(tmp_path, time.monotonic())  # the stopped rank too (it dies with its launcher)
    print(f"SIGSTOPped rank 1 -> job exit {job.returncode} in {took:.1f} s")


@pytest.mark.multiprocess
def test_a_stalled_data_worker_ends_the_job_with_one_line_within_the_bound(tmp_path, fashion_root, shared_tmp):
    """--data.num_workers 1: rank 1's worker stops delivering at its 3rd batch. Rank 1 waits half the collective
    timeout for its batch (torch would wait forever), says so in one line and exits 75; rank 0 ends with it,
    and no worker is left behind (a stuck worker ignores SIGTERM; the rank kills it at exit). The temp folder is the
    test's own: rank 0, SIGKILLed by Lightning's launcher, leaves its workers' folder there (docs/reliability.md)."""
    record = tmp_path / "record"
    record.mkdir()
    env = clean_env({"SAMPLE_RECORD_DIR": str(record), TIMEOUT_ENV: str(TEST_TIMEOUT_S), "TMPDIR": str(shared_tmp)})
    (job,) = start_all([("launcher", argv(fashion_root, "--data.num_workers", "1",
                                          "--trainer.callbacks+=tests.recorder.StallDataWorker",
                                          "--trainer.callbacks.after=3"), tmp_path, env)],
                       tmp_path / "logs")
    deadline = time.monotonic() + TIMEOUT_S
    while not (record / "stalled").exists():
        assert time.monotonic() < deadline and not job.exited(), job.tail()
        time.sleep(0.05)
    stalled = time.monotonic()
    timed_out = wait_all([job], BOUND_S + 10)
    took = time.monotonic() - stalled
    assert timed_out is None, timed_out
    assert job.returncode != 0 and took < BOUND_S, (job.returncode, took, job.tail())
    lines = [line for line in error_lines(job.stderr) if "data loader worker" in line]
    assert lines == [f"train.py: error: rank 1: a data loader worker delivered no batch for "
                     f"{TEST_TIMEOUT_S // 2} s (the worker stalled: stuck reading, or deadlocked); "
                     f"--data.num_workers 0 (the default) loads in the rank itself; if a batch can legitimately take "
                     f"that long, raise --data.worker_timeout (below --collective_timeout, now {TEST_TIMEOUT_S} "
                     f"s)"], job.tail()
    report = report_lines(job.stderr)  # rank 1's workers: the stalled one of training, validation's idle one
    assert [line for line in report if re.fullmatch(r"rank 1's data worker \(pid \d+\) is in tests/recorder\.py:\d+ "
                                                    r"__getitems__(, .*)?", line)], job.tail()
    # the worker's own dump (faulthandler), in rank 1's file (rank 0, its peer lost, may report after it)
    workers = [line for line in report if line.startswith("every thread's stack of its data workers: ")]
    assert 'tests/recorder.py", line' in stacks_file(workers, tmp_path)
    assert "Traceback" not in job.stderr
    assert_nothing_left(tmp_path, time.monotonic())
    print(f"stalled data worker on rank 1 -> job exit {job.returncode} in {took:.1f} s")


@pytest.mark.multiprocess
def test_ranks_that_cannot_meet_end_with_one_line_within_the_bound(tmp_path, fashion_root):
    """Two start-up faults, run side by side (each mostly waits), each timed from its rendezvous start:

    - busy: MASTER_PORT is held by another process, so rank 0 cannot host the rendezvous. One line naming the
      port, exit 75, and rank 1 (already started by Lightning's launcher, connecting to the squatter) does not
      linger.
    - alone: rank 0 of a 2-rank job started by hand (as torchrun or a cluster script would); rank 1 never
      starts. Rank 0 waits the 20 s timeout at the rendezvous, says how many joined and what to do, exits 75.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        busy_env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), TIMEOUT_ENV: str(TEST_TIMEOUT_S)})
        alone_env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
                               "NODE_RANK": "0", "LOCAL_RANK": "0", TIMEOUT_ENV: str(TEST_TIMEOUT_S)})
        for name in ("busy", "alone"):
            (tmp_path / name).mkdir()
        jobs = start_all([("busy", argv(fashion_root), tmp_path / "busy", busy_env),
                          ("alone", argv(fashion_root), tmp_path / "alone", alone_env)], tmp_path / "logs")
        began, ended = {}, {}
        deadline = time.monotonic() + TIMEOUT_S
        while len(ended) < len(jobs) and time.monotonic() < deadline:
            for job in jobs:
                if job.name not in began and "Initializing distributed: GLOBAL_RANK: 0" in job.stderr:
                    began[job.name] = time.monotonic()
                if job.name not in ended and job.exited():
                    ended[job.name] = time.monotonic()
            time.sleep(0.05)
        timed_out = wait_all(jobs, 1)
    assert timed_out is None and set(began) == set(ended) == {"busy", "alone"}, timed_out or (began, ended)
    took = {name: ended[name] - began[name] for name in began}
    busy, alone = jobs
    assert busy.returncode == TEMPFAIL and took["busy"] < BOUND_S, (took, busy.tail())
    assert error_lines(busy.stderr) == [
        f"train.py: error: rank 0: MASTER_PORT {port} is already in use on this machine (another job, or a process "
        f"left from one, listens on it): unset MASTER_PORT to let train.py pick a free port, or set a free one"
    ], busy.tail()
    assert alone.returncode == TEMPFAIL and TEST_TIMEOUT_S - 5 < took["alone"] < BOUND_S, (took, alone.tail())
    lines = error_lines(alone.stderr)
    assert len(lines) == 1 and re.fullmatch(
        rf"train\.py: error: rank 0 waited \d+ s for the other ranks to join, and only 1 of 2 did: start every rank "
        rf"\(same MASTER_ADDR, MASTER_PORT and WORLD_SIZE\) within collective_timeout \(now {TEST_TIMEOUT_S} s\) of "
        rf"each other, and check that they can reach MASTER_ADDR:MASTER_PORT", lines[0]), alone.tail()
    assert report_lines(alone.stderr) == ["only this rank joined; rank 1 never reached MASTER_ADDR:MASTER_PORT"]
    assert all("Traceback" not in job.stderr for job in jobs)
    for name in ("busy", "alone"):
        assert_nothing_left(tmp_path / name, time.monotonic())
    print(f"busy MASTER_PORT -> exit 75 {took['busy']:.1f} s, peer never joined -> exit 75 {took['alone']:.1f} s "
          f"after the rendezvous began")






def test_num_nodes_without_a_launcher_says_how_to_launch_each_node_at_once(tmp_path, fashion_root):
    """Every node would take itself for node 0 and wait out the collective timeout (300 s): one line, exit 2, before
    any process group exists (measured 7.3 s on an idle 2-core machine, nearly all of it importing torch)."""
    started = time.monotonic()
    argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--num_nodes", "2", "--data_dir",
            str(fashion_root)]
    (job,) = start_all([("nodes", argv, tmp_path, clean_env())], tmp_path / "logs")
    assert wait_all([job], 60) is None
    took = time.monotonic() - started
    assert job.returncode == 2, job.tail()
    (line,) = error_lines(job.stderr)
    assert "--num_nodes 2 needs a launcher on every node" in line and "torchrun --nnodes 2" in line, line
    assert "Initializing distributed" not in job.stderr and took < 30, took


def listening(port: int) -> bool:
    """Whether a socket of this host listens on TCP ``port`` (the kernel's tables: nothing connects to it)."""
    tables = [Path(f"/proc/net/{name}") for name in ("tcp", "tcp6")]
    rows = [line.split() for table in tables if table.exists() for line in table.read_text().splitlines()[1:]]
    return any(int(row[1].rsplit(":", 1)[1], 16) == port and row[3] == "0A" for row in rows)  # 0A: LISTEN


@pytest.mark.multiprocess
@pytest.mark.parametrize("name, code, line", [("SIGTERM", 143, "train.py: stopped by SIGTERM outside training"),
                                              ("SIGINT", 130, "train.py: interrupted (Ctrl-C) outside training")])
def test_a_signal_while_the_rendezvous_waits_ends_the_process_at_once_with_one_line(tmp_path, fashion_root, name,
                                                                                    code, line):
    """Rank 0 of a 2-rank job started by hand waits in the rendezvous for a rank 1 that never comes; the signal's
    Python handler could only run when torch's wait returns (after the collective timeout)."""
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
                     "NODE_RANK": "0", "LOCAL_RANK": "0", TIMEOUT_ENV: "120"})
    argv = [str(TRAIN_PY), "--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--network", "mlp",
            "--data_dir", str(fashion_root)]
    (job,) = start_all([("alone", argv, tmp_path, env)], tmp_path / "logs")
    deadline = time.monotonic() + TIMEOUT_S
    port = int(env["MASTER_PORT"])
    while not listening(port) and time.monotonic() < deadline and not job.exited():  # its store up: it waits in it
        time.sleep(0.1)
    assert listening(port), job.tail()
    sent = time.monotonic()
    os.kill(job.proc.pid, getattr(signal, name))
    assert wait_all([job], 30) is None
    took = time.monotonic() - sent
    assert job.returncode == code and took < 10, (took, job.tail())
    assert [entry for entry in job.stderr.splitlines() if entry.startswith("train.py:")] == [
        f"{line}: no step to stop at, nothing saved"], job.tail()
    assert "Traceback" not in job.stderr
    assert_nothing_left(tmp_path, time.monotonic())
    print(f"{name} during the rendezvous -> exit {code} in {took:.1f} s")


@pytest.mark.parametrize("reported", [True, False], ids=["after-its-line", "before-any-line"])
def test_a_sigterm_after_the_processs_own_line_ends_it_with_that_code_and_no_second_line(reported):
    """A rank that failed prints its line, then signals its step (scancel, which waits on a dead node's slurmd); srun
    --kill-on-bad-exit's SIGTERM came meanwhile, and the watcher printed "stopped by SIGTERM outside training" and
    exited 143 over the rank's own line and 75 (seen on the two-node SLURM, tests/cluster/test_two_nodes.py)."""
    code = ("import os, signal, time\n"
            "from fashion_mnist_dp.runtime import signals\n"
            "handlers = signals.Handlers().install()\n"
            "handlers.watch()\n"
            "print('train.py: error: the first line', flush=True)\n"
            f"{'handlers.exiting(75)' if reported else 'pass'}\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                            timeout=120)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("train.py:")]
    if reported:
        assert (result.returncode, lines) == (75, ["train.py: error: the first line"]), result.stderr
    else:  # a signal before any line: the watcher's own line and 143, as before
        assert result.returncode == 143 and lines[1:] == [
            "train.py: stopped by SIGTERM outside training: no step to stop at, nothing saved"], result.stderr


def test_a_rendezvous_address_that_does_not_resolve_ends_the_rank_at_once_with_one_line(tmp_path, fashion_root):
    """c10d retried a name that does not resolve (a SLURM node name missing from DNS) for the whole timeout, or
    without end; the rank now checks it before the rendezvous (docs/running-on-clusters.md)."""
    env = {"MASTER_ADDR": "fmn-nowhere.invalid", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "NODE_RANK": "0", TIMEOUT_ENV: str(TEST_TIMEOUT_S)}
    started = time.monotonic()
    result = run_train(["--data_dir", str(fashion_root), "--network", "mlp", "--strategy", "ddp", "--devices", "1",
                        "--num_nodes", "2", "--accelerator", "cpu", "--epochs", "1"], cwd=tmp_path, env=env,
                       timeout=TIMEOUT_S)
    took = time.monotonic() - started
    assert result.returncode == TEMPFAIL and took < TEST_TIMEOUT_S, (result.returncode, took, result.stderr[-2000:])
    assert error_lines(result.stderr) == [
        "train.py: error: the rendezvous address fmn-nowhere.invalid (MASTER_ADDR) does not resolve on this host: set "
        "MASTER_ADDR to the IP address of rank 0's node, or make fmn-nowhere.invalid resolve here (DNS, /etc/hosts)"]
    assert "Traceback" not in result.stderr


def test_main_destroys_the_process_group_it_made_before_the_interpreter_exits(workdir, fashion_root):
    """Left to the interpreter's exit, gloo's worker threads can abort a rank ("terminate called without an active
    exception": exit -6 instead of the decided code, seen under load in tests/test_divergence.py)."""
    import torch.distributed

    from fashion_mnist_dp.cli import app

    args = ["--strategy", "ddp", "--devices", "1", "--accelerator", "cpu", "--network", "mlp", "--epochs", "1",
            "--data_dir", str(fashion_root), "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
            "--test_after_fit", "false"]
    assert app.main(args) == 0
    assert not torch.distributed.is_initialized()


@pytest.mark.multiprocess
def test_a_rank_with_peers_exits_with_its_code_after_its_atexit_handlers_and_output(tmp_path):
    """``runtime.exit_process`` (train.py's end): each of 3 gloo ranks, rank 0 last, ends with the code given, its
    atexit handler has run and its unflushed output is out, as a plain exit would have them."""
    code = ("import atexit, sys, time, torch.distributed as dist\n"
            "from fashion_mnist_dp.runtime import exit_process\n"
            "dist.init_process_group('gloo')\n"
            "rank = dist.get_rank()\n"
            "atexit.register(lambda: open(sys.argv[1] + f'/atexit{rank}', 'w').close())\n"
            "dist.barrier()\n"
            "time.sleep(0.5 if rank == 0 else 0)\n"
            "print(f'rank {rank} done', end='')\n"
            "exit_process(40 + rank)\n")
    ranks = launch.python_ranks(code, [tmp_path], 3, gloo=True)
    outputs = launch.outputs(ranks, timeout_s=60)
    assert [rank.returncode for rank in ranks] == [40, 41, 42]
    assert outputs == ["rank 0 done", "rank 1 done", "rank 2 done"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["atexit0", "atexit1", "atexit2"]


def test_without_a_process_group_exit_process_is_a_plain_exit():
    from fashion_mnist_dp.runtime import exit_process

    with pytest.raises(SystemExit) as exited:
        exit_process(3)
    assert exited.value.code == 3
