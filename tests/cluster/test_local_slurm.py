"""The SLURM tier's own guarantees: in CI it cannot skip silently, and the cluster it starts is gone afterwards,
even when starting fails half-way or a job leaves a process behind."""

import re
import time

import pytest

from benchmarks.launch import REPO
from tests.cluster.conftest import REQUIRE_SLURM, skip_or_fail
from tests.cluster.local_slurm import LocalSlurm, _alive, install_reason


def test_a_slurm_tier_that_cannot_start_skips_with_its_reason_and_fails_where_it_is_required(monkeypatch):
    monkeypatch.delenv(REQUIRE_SLURM, raising=False)
    skip_or_fail(None)  # SLURM can run: nothing happens
    with pytest.raises(pytest.skip.Exception, match="not root with apt-get"):
        skip_or_fail("no SLURM here (srun missing) and not root with apt-get to install slurm-wlm munge")
    monkeypatch.setenv(REQUIRE_SLURM, "1")
    with pytest.raises(pytest.fail.Exception, match=rf"{REQUIRE_SLURM}=1 but the SLURM tests cannot run: no SLURM"):
        skip_or_fail("no SLURM here")


def test_ci_requires_the_slurm_tier_before_it_runs_the_readmes_test_command():
    script = (REPO / ".ci" / "run").read_text()
    exported = re.search(rf"^export {REQUIRE_SLURM}=1$", script, flags=re.M)
    test = re.search(r"^(\w+=\S+ )*make test$", script, flags=re.M)  # behind an environment for that command
    assert exported and test and exported.start() < test.start(), script


@pytest.fixture
def slurm_programs():
    skip_or_fail(install_reason())


def test_a_start_that_fails_half_way_stops_the_daemons_it_started(slurm_programs, tmp_path):
    cluster = LocalSlurm(tmp_path)
    started = {}
    real_daemon = cluster._daemon

    def daemon(name, argv, pid_file):
        if name == "slurmd":  # a real failure: slurmd with a configuration that names no cluster
            (tmp_path / "empty.conf").write_text("# no ClusterName\n")
            argv = ["slurmd", "-f", str(tmp_path / "empty.conf")]
        real_daemon(name, argv, pid_file)
        started[name] = cluster.pids[name]

    cluster._daemon = daemon
    with pytest.raises(RuntimeError, match="slurmd did not start"):
        cluster.start()
    assert set(started) == {"munged", "slurmctld"}
    assert [name for name, pid in started.items() if _alive(pid)] == []
    assert cluster.pids == {} and cluster.leftovers() == []


def test_stop_kills_a_job_process_that_outlives_the_jobs_cancellation(slurm_programs, tmp_path):
    """A job that leaves a process outside its step (a double fork: SLURM's proctrack/linuxproc loses it, and
    scancel does not reach it) must not outlive the cluster."""
    cluster = LocalSlurm(tmp_path / "slurm").start()
    pid_file = tmp_path / "escaped.pid"
    try:
        script = tmp_path / "escape.sbatch"
        # a double fork: the sleep's parent exits at once, so it is no descendant of the job's slurmstepd
        script.write_text(f"#!/bin/bash\n(setsid sleep 600 < /dev/null > /dev/null 2>&1 & echo $! > {pid_file})\n"
                          "sleep 600\n")
        result = cluster.run("sbatch", "--parsable", "--chdir", str(tmp_path), "--output", "/dev/null", str(script))
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, cluster.log_tail("slurmd")
            time.sleep(0.2)
        escaped = int(pid_file.read_text())
        assert _alive(escaped) and escaped in cluster.leftovers()
    finally:
        cluster.stop()
    assert not _alive(escaped), f"pid {escaped} outlived the cluster"
    assert cluster.leftovers() == []
