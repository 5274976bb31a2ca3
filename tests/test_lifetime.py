"""No unbounded hang: a lost or stuck rank ends the whole job within the collective timeout + 30 s, and ranks die
with their launcher. The jobs here run with FASHION_MNIST_COLLECTIVE_TIMEOUT=20 (the default is 300 s)."""

import os
import signal
import time
from datetime import timedelta

import pytest
from lightning.pytorch.strategies import StrategyRegistry

from strategies import register_strategies
from strategies.lifetime import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, collective_timeout, set_collective_timeout
from tests.processes import _alive, process_tree, running_in, wait_all
from tests.test_preemption import start_launcher

TEST_TIMEOUT_S = 20
BOUND_S = TEST_TIMEOUT_S + 30
TIMEOUT_S = 150


def test_the_timeout_comes_from_the_environment_with_a_5_minute_default():
    assert collective_timeout({}) == timedelta(seconds=DEFAULT_TIMEOUT_S) == timedelta(minutes=5)
    assert collective_timeout({TIMEOUT_ENV: "20"}) == timedelta(seconds=20)
    for bad in ("0", "-1", "abc", "inf", "nan"):
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            collective_timeout({TIMEOUT_ENV: bad})


def test_every_ddp_and_fsdp_strategy_name_gets_the_timeout(monkeypatch):
    register_strategies()
    monkeypatch.setenv(TIMEOUT_ENV, "20")
    try:
        set_collective_timeout()
        for name in ("ddp", "ddp_spawn", "fsdp", "fsdp_cpu"):
            assert StrategyRegistry.get(name)._timeout == timedelta(seconds=20), name
    finally:
        set_collective_timeout(timedelta(seconds=DEFAULT_TIMEOUT_S))


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
    timeout, fails, and rank 1 dies with it (Lightning's default would wait 30 minutes)."""
    job, _ = start_job(tmp_path, fashion_root, "--trainer.callbacks+=tests.recorder.HangRank")
    started = time.monotonic()
    timed_out = wait_all([job], BOUND_S + 10)
    took = time.monotonic() - started
    assert timed_out is None, timed_out
    assert job.returncode != 0 and TEST_TIMEOUT_S - 5 < took < BOUND_S, (job.returncode, took)
    assert "timed out" in job.stderr.lower() or "timeout" in job.stderr.lower(), job.tail()
    assert running_in(tmp_path) == []
    print(f"stuck rank 1 -> job exit {job.returncode} in {took:.1f} s")
