"""docs/running-on-clusters.md's SLURM recipes against a real SLURM (slurmctld, slurmd and munge on this machine):
the sbatch script as the document writes it, on CPU; srun's task layouts; a failing task; preemption with SIGUSR1,
``scontrol requeue`` and an exact resume; ``scancel``.

Each job trains the mlp on the tiny data with two tasks (gloo), seeded and deterministic: 4 optimizer steps per
epoch. Failure-to-exit times are printed (``-s`` shows them) for docs/running-on-clusters.md.
"""

import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from benchmarks.launch import TRAIN_PY, clean_env, running_in
from tests.cluster import recipes
from tests.cluster.local_slurm import CRED_EXPIRE_S
from tests.cluster.recipes import (STEPS_PER_EPOCH, assert_same_weights, final_checkpoint, final_checkpoint_in,
                                  sbatch_script)

# a signal stops the run at the next step; a rank stuck (a peer that never joins, a lost collective) ends the job
# with the product's own line within COLLECTIVE_TIMEOUT_S, inside the test's wait
COLLECTIVE_TIMEOUT_S = 60
SEEDED = [*recipes.SEEDED, "--check_every_n_steps", "1", "--collective_timeout", str(COLLECTIVE_TIMEOUT_S)]
EPOCHS = 4
# How long the tier waits for a job (or srun) at most: a net against a hang, not a bound any test asserts. On the
# 2-core machine with a CPU hog and a load average near 9, a job took 2.5 min to reach its sixth step and its
# requeued start more than the 3 min this used to be; a requeued job also waits cred_expire + 1 s before it starts.
JOB_TIMEOUT_S = 600 + CRED_EXPIRE_S
# a failed task ends its whole step within this, timed from the failure (docs/running-on-clusters.md); without the
# failed task's signal to its step the others would wait out the collective timeout, 300 s by default
FAILURE_BOUND_S = 60
# the ranks stop at the marked step until the test's signal has reached them (tests.recorder.SlowSteps), so the signal
# lands in training however long the test takes to send it; the hold's limit is the test's own wait for the job
HOLD = ["--trainer.callbacks.hold_s", str(JOB_TIMEOUT_S)]


def job_info(slurm, job_id: str) -> Dict[str, str]:
    """``scontrol show job -o``'s fields (JobState, ExitCode, Restarts, Reason...)."""
    line = slurm.run("scontrol", "show", "job", "-o", job_id).stdout
    return dict(re.findall(r"(\w+)=(\S*)", line))


def wait_job(slurm, job_id: str, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"),
             timeout_s: float = JOB_TIMEOUT_S) -> Dict[str, str]:
    """Poll until the job is in one of ``states``. A requeued job starts again after SLURM's own delay (BeginTime,
    ``cred_expire`` + 1 s: 11 s on the tier's cluster unless FASHION_MNIST_SLURM_CRED_EXPIRE says); the tier never
    forces it with ``StartTime=now``, which can start it within the second its old credential was revoked, and SLURM
    then ends it FAILED, exit 1."""
    deadline = time.monotonic() + timeout_s
    info: Dict[str, str] = {}
    while time.monotonic() < deadline:
        info = job_info(slurm, job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(0.5)
    left = []
    for pid in running_in(Path(info.get("WorkDir", "/nonexistent"))):  # each rank's Python stacks into the job's
        with contextlib.suppress(OSError):                             # output (PYTHONFAULTHANDLER: sbatch below)
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            left.append(f"{pid} (parent {Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[1]}): "
                        f"{b' '.join(argv).decode(errors='replace')[:300]}")
            if Path(argv[0].decode()).name.startswith("python") and b"train.py" in b" ".join(argv):  # not srun
                os.kill(pid, signal.SIGABRT)
                time.sleep(1)
    slurm.run("scancel", job_id)
    out = Path(info.get("StdOut", "/nonexistent"))
    job_output = out.read_text(errors="replace")[-12000:] if out.is_file() else f"(no {out})"
    raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout_s:.0f} s: {info}\n"
                         f"--- its processes:\n" + "\n".join(left) + f"\n--- the job's output:\n{job_output}\n"
                         f"{slurm.log_tail('slurmd')}\n"
                         f"{slurm.log_tail('slurmctld')}")


def sbatch(slurm, folder: Path, extra: List[str], **env: str) -> str:
    """The document's sbatch script, submitted from ``folder``; returns the job id. Output appends to
    ``folder/slurm.out`` (a requeued job writes after the first run's lines)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "train.sbatch"
    script.write_text(sbatch_script(extra))
    result = slurm.run("sbatch", "--parsable", "--chdir", str(folder), "--output", str(folder / "slurm.out"),
                       "--open-mode=append", str(script), env=clean_env({"PYTHONFAULTHANDLER": "1", **env}))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def srun(slurm, folder: Path, layout: List[str], args: List[str], **env: str):
    """``srun LAYOUT python train.py ARGS`` from ``folder`` (no --kill-on-bad-exit); (result, wall-clock end)."""
    folder.mkdir(parents=True, exist_ok=True)
    result = slurm.run("srun", *layout, sys.executable, str(TRAIN_PY), *args, env=clean_env(env), cwd=folder,
                       timeout=JOB_TIMEOUT_S)
    return result, time.time()


@pytest.fixture(scope="module")
def clean_job(slurm, fashion_root, tmp_path_factory):
    """The sbatch script run to its end, undisturbed: what every interrupted job must end as."""
    folder = tmp_path_factory.mktemp("clean-job")
    job = sbatch(slurm, folder, [*SEEDED, "--epochs", str(EPOCHS), "--data_dir", str(fashion_root)])
    return folder, wait_job(slurm, job)


@pytest.mark.oldest
def test_the_sbatch_script_trains_on_cpu_as_written(clean_job):
    folder, info = clean_job
    output = (folder / "slurm.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{output[-3000:]}"
    assert [line.split(":")[0] for line in output.splitlines() if line.startswith("Epoch ")] == \
        [f"Epoch {e}" for e in range(1, EPOCHS + 1)]
    assert "Traceback" not in output
    assert final_checkpoint(folder)["global_step"] == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.oldest
def test_sigusr1_saves_requeues_and_the_requeued_job_resumes_to_the_same_weights(slurm, clean_job, fashion_root,
                                                                                  tmp_path):
    folder = tmp_path / "job"
    record = tmp_path / "record"
    record.mkdir()
    args = [*SEEDED, "--epochs", str(EPOCHS), "--data_dir", str(fashion_root),
            "--trainer.callbacks+=tests.recorder.SlowSteps", "--trainer.callbacks.mark_at=6", *HOLD]
    job = sbatch(slurm, folder, args, SAMPLE_RECORD_DIR=str(record))
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (record / "step").exists():
        assert time.monotonic() < deadline and job_info(slurm, job).get("JobState") in ("PENDING", "RUNNING"), \
            f"training never reached step 6: {job_info(slurm, job)}\n{_output(folder)}"
        time.sleep(0.2)
    # What #SBATCH --signal=SIGUSR1@90 does 90 s before the time limit: SIGUSR1 to every task of the job's steps.
    assert slurm.run("scancel", "--signal=USR1", job).returncode == 0
    info = wait_job(slurm, job)
    output = _output(folder)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0" and info["Restarts"] == "1", \
        f"{info}\n{output[-4000:]}"
    assert re.search(r"stopped by SIGUSR1 at optimizer step \d+ .*checkpoint saved and verified: .*last\.ckpt .*"
                     rf"SLURM job {job} requeued", output), output[-4000:]
    assert output.count("Restored all states from the checkpoint") == 1
    assert "outside training" not in output and "Traceback" not in output

    assert_same_weights(final_checkpoint(clean_job[0]), final_checkpoint(folder), EPOCHS * STEPS_PER_EPOCH)


def test_scancel_leaves_no_process_and_a_loadable_last_checkpoint(slurm, fashion_root, tmp_path):
    folder = tmp_path / "job"
    record = tmp_path / "record"
    record.mkdir()
    args = [*SEEDED, "--epochs", "50", "--data_dir", str(fashion_root),
            "--trainer.callbacks+=tests.recorder.SlowSteps", "--trainer.callbacks.mark_at=2", *HOLD]
    job = sbatch(slurm, folder, args, SAMPLE_RECORD_DIR=str(record))
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (record / "step").exists():
        assert time.monotonic() < deadline, f"training never started: {job_info(slurm, job)}\n{_output(folder)}"
        time.sleep(0.2)
    assert running_in(folder), "no process of the job runs in its folder"
    cancelled = time.monotonic()
    assert slurm.run("scancel", job).returncode == 0
    info = wait_job(slurm, job, states=("CANCELLED",))
    while running_in(folder) and time.monotonic() < cancelled + FAILURE_BOUND_S:
        time.sleep(0.2)
    print(f"\nscancel to no process left: {time.monotonic() - cancelled:.1f} s")
    assert running_in(folder) == [], f"processes left after scancel: {running_in(folder)}\n{_output(folder)}"
    assert info["JobState"] == "CANCELLED", info
    output = _output(folder)
    assert "stopped by SIGTERM at optimizer step" in output and "checkpoint saved and verified" in output, output
    assert "Traceback" not in output
    checkpoint = final_checkpoint(folder)  # sha256 checked against its sidecar, loaded without running code
    assert 0 < checkpoint["global_step"] < 50 * STEPS_PER_EPOCH


@pytest.mark.parametrize("layout, devices, expected", [
    (["-n", "2"], "2", "SLURM started 2 tasks without --ntasks-per-node, which Lightning needs to place ranks"),
    (["--ntasks-per-node", "2"], "1", "SLURM started 2 task(s) per node but --devices is 1"),
    (["--ntasks-per-node", "2"], "2 --num_nodes 2", "SLURM allocated 1 node(s) but --num_nodes is 2"),
], ids=["srun-n-2", "tasks-not-devices", "nodes-not-num_nodes"])
def test_a_task_layout_the_trainer_cannot_use_ends_with_one_line_and_exit_2(slurm, fashion_root, tmp_path, layout,
                                                                             devices, expected):
    args = ["--strategy", "ddp", "--accelerator", "cpu", "--devices", *devices.split(), "--network", "mlp",
            "--epochs", "1", "--data_dir", str(fashion_root)]
    result, _ = srun(slurm, tmp_path, layout, args)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("train.py")]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("rank_1", ["waiting", "importing"])
def test_a_task_failing_before_training_ends_the_step_without_kill_on_bad_exit(slurm, tmp_path, rank_1):
    """Rank 0 finds no data (exit 65) while rank 1 waits to join its process group: without the failed task's
    SIGUSR2 to its step, rank 1 waited 2 x 300 s (the collective timeout, retried once). ``importing``: rank 1 is
    still importing Lightning when the signal comes: before train.py listened from its first lines, it died by the
    signal and srun returned 140. tests/cluster/staged_start holds rank 1 at either point until rank 0 has failed
    (each task waits for the other's record, not for a time), and records it."""
    args = ["--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--network", "mlp", "--epochs", "1",
            "--data_dir", str(tmp_path / "no-data")]
    record = tmp_path / "record"
    record.mkdir()
    env = {"PYTHONPATH": str(Path(__file__).parent / "staged_start"), "STAGED_START": rank_1,
           "STAGED_START_RECORD": str(record)}
    result, ended = srun(slurm, tmp_path, ["--ntasks-per-node", "2"], args, **env)
    # srun returns the highest code of its tasks: the failed task's
    assert result.returncode == 65, f"exit {result.returncode}:\n{result.stderr[-3000:]}\n{result.stdout[-2000:]}"
    # timed from rank 0's exit (after its line and its signal to the step), not from the start: the start-up's
    # imports are what load stretches, and a rank left waiting would take the collective timeout (300 s) or more
    after_failure = ended - (record / "task0-exited").stat().st_mtime
    print(f"\nsrun, rank 0 without data, rank 1 {rank_1}: the step ended {after_failure:.1f} s after rank 0 exited")
    assert after_failure < FAILURE_BOUND_S
    assert re.search(r"^train\.py: error: Fashion-MNIST not found", result.stderr, flags=re.M), result.stderr
    if rank_1 == "importing":  # the signal came while rank 1 was importing: it ended there, without a line
        assert (record / "importing").exists() and not (record / "imported").exists()
        assert "rank 1: stopped because" not in result.stderr, result.stderr
    else:  # rank 1 listened before rank 0 went on to fail
        assert (record / "listening").exists()
        assert re.search(r"^train\.py: rank 1: stopped because another task of SLURM step \d+\.\d+ failed",
                         result.stderr, flags=re.M), result.stderr
    assert "Traceback" not in result.stderr


def test_a_task_killed_during_training_ends_the_step_without_kill_on_bad_exit(slurm, fashion_root, tmp_path):
    """Rank 1 SIGKILLs itself 2 steps after the first epoch's checkpoint (tests.recorder.KillAfterCheckpoint)."""
    record = tmp_path / "record"
    record.mkdir()
    args = ["--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", *SEEDED, "--epochs", "50",
            "--data_dir", str(fashion_root), "--trainer.callbacks+=tests.recorder.KillAfterCheckpoint"]
    result, ended = srun(slurm, tmp_path, ["--ntasks-per-node", "2"], args, SAMPLE_RECORD_DIR=str(record))
    after_kill = ended - (record / "killed-0").stat().st_mtime
    print(f"\nsrun, rank 1 SIGKILLed in training: the step ended {after_kill:.1f} s after the kill")
    assert result.returncode == 128 + 9, result.stderr[-3000:]  # srun: the highest code, here the killed task's
    assert after_kill < FAILURE_BOUND_S
    assert re.search(r"^train\.py: error: rank 0 lost its connection to another rank", result.stderr, flags=re.M), \
        result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def _output(folder: Path, name: str = "slurm.out") -> str:
    path = folder / name
    return path.read_text(errors="replace") if path.exists() else "(no slurm.out yet)"


def test_a_requeued_task_of_a_job_array_resumes_its_own_run_while_the_other_trains(slurm, fashion_root, tmp_path):
    """The seed sweep of docs/running-on-clusters.md as a two-task array in one folder: task 1 is requeued (SIGUSR1)
    while task 2 trains, then task 2 while task 1 trains again; each resumes its own run (its seed, its job), never
    the other's, which is newer and running."""
    folder, record = tmp_path / "sweep", tmp_path / "record"
    folder.mkdir()
    record.mkdir()
    unseeded = [arg for arg in SEEDED if arg not in ("--seed", "7")]  # the script gives each task its own
    # Each task trains on, saving a checkpoint every epoch (the newer run its peer must not resume), and cannot end on
    # its own before the test is done with it: its steps of at least step_s take longer than the test's four waits for
    # a start (JOB_TIMEOUT_S each) together. The test ends both tasks with scancel.
    step_s = 0.5
    epochs = 1 + int(4 * JOB_TIMEOUT_S / (STEPS_PER_EPOCH * step_s))
    extra = [*unseeded, "--epochs", str(epochs), "--data_dir", str(fashion_root),
             "--trainer.callbacks+=tests.recorder.SlowSteps", f"--trainer.callbacks.seconds={step_s}",
             "--trainer.callbacks.mark_at=2"]
    script = folder / "sweep.sbatch"
    script.write_text(sbatch_script(extra, array="1-2"))
    submitted = slurm.run("sbatch", "--parsable", "--chdir", str(folder), "--output", str(folder / "task-%a.out"),
                          "--open-mode=append", str(script),
                          env=clean_env({"PYTHONFAULTHANDLER": "1", "SAMPLE_RECORD_DIR": str(record)}))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    tasks = {task: f"{job}_{task}" for task in (1, 2)}

    def training(task: int, start: int) -> None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not (record / f"step-{task}-{start}").exists():
            assert time.monotonic() < deadline, f"task {task} never trained in start {start}: " \
                f"{job_info(slurm, tasks[task])}\n{_output(folder, f'task-{task}.out')}"
            time.sleep(0.2)

    try:
        training(1, 0)
        training(2, 0)
        for task, other in ((1, 2), (2, 1)):
            assert slurm.run("scancel", "--signal=USR1", tasks[task]).returncode == 0
            training(task, 1)  # requeued, started again, resumed and training
            assert job_info(slurm, tasks[other]).get("JobState") == "RUNNING"  # the other ran all along
    finally:
        slurm.run("scancel", job)
    for task in tasks.values():
        wait_job(slurm, task, states=("CANCELLED", "COMPLETED", "FAILED"))
    experiment = folder / "runs" / "mlp-ddp-batch32-sgd"
    folders = sorted((p.parent for p in experiment.glob("*/run.json")), key=lambda f: f.name.rpartition("-seed")[2])
    assert [f.name.rpartition("-seed")[2] for f in folders] == ["1", "2"], folders
    for task, run in zip((1, 2), folders):
        output = _output(folder, f"task-{task}.out")
        starts = json.loads((run / "run.json").read_text())["starts"]
        assert {key for start in starts for key in start["jobs"]} == {f"SLURM job {job}_{task}"}, starts
        assert len(starts) == 2 and starts[1]["resumed_from"] == str(run / "checkpoints" / "last.ckpt"), starts
        assert re.search(rf"^  run +: runs/mlp-ddp-batch32-sgd/{run.name} \(resumed at optimizer step \d+, the run "
                         rf"of this SLURM job {job}_{task}; seed {task}\)$", output, flags=re.M), output[-4000:]
        assert "Traceback" not in output
        assert final_checkpoint_in(run)["global_step"] > 0


def test_a_task_stuck_in_python_is_named_with_its_step_and_where_under_srun(slurm, fashion_root, tmp_path):
    """srun's two tasks; rank 1 stops in a callback at step 6: rank 0 times out, its hang report names rank 1, the
    step and the function, and the step ends (exit 75, the highest of its tasks') within the timeout + 30 s."""
    record = tmp_path / "record"
    record.mkdir()
    args = ["--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", *SEEDED, "--epochs", "50", "--data_dir",
            str(fashion_root), "--collective_timeout", "20", "--trainer.callbacks+=tests.recorder.HangRank"]
    result, ended = srun(slurm, tmp_path, ["--ntasks-per-node", "2"], args, SAMPLE_RECORD_DIR=str(record))
    seconds = ended - (record / "hung").stat().st_mtime
    print(f"\nsrun, rank 1 stuck in Python: the step ended {seconds:.1f} s after the hang")
    assert result.returncode == 75, result.stderr[-3000:]
    assert seconds < 20 + 30  # the collective timeout, then the report (its wait for answers is 10 s at most)
    assert re.search(r"^train\.py: error: rank 0 timed out after 20 s waiting for the other ranks", result.stderr,
                     flags=re.M), result.stderr[-3000:]
    assert re.search(r"^train\.py: hang report: rank 1 did not arrive: at optimizer step 6 \(training step\), in "
                     r"tests/recorder\.py:\d+ on_train_batch_end", result.stderr, flags=re.M), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
