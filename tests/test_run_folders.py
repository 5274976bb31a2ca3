"""Many runs at once: two runs of one experiment started at the same moment into one root keep every file apart and
each resumes its own weights; ``--ckpt_path last`` resumes across a change of device count; a root from before runs
had folders of their own still resumes; a name held by a running run ends the second run in one line. And the run
folder's own parts: made atomically by processes that start at once, held while the run lives (runtime/runs.py)."""

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.launch import clean_env, start_all, stop, wait_all
from fashion_mnist_dp.cli import app
from fashion_mnist_dp.runtime import runs
from fashion_mnist_dp.runtime.checkpoint_io import VerifiedCheckpointIO
from fashion_mnist_dp.runtime.errors import ConfigError
from fashion_mnist_dp.runtime.resume import resolve
from tests.conftest import REPO, TRAIN_PY, run_train
from tests.test_exact_resume import assert_bitwise_equal

TIMEOUT_S = 180
MLP = ["--network", "mlp", "--batch_size", "32", "--test_after_fit", "false"]
RUN_FILES = ("checkpoints/last.ckpt", "config.yaml", "hparams.yaml", "metrics.csv", "run.json")


def run_folders(cwd: Path):
    """Every run folder under ``cwd/runs``: ``runs/<experiment>/<run>``."""
    return sorted(p.parent for p in (cwd / "runs").glob(f"*/*/{runs.RECORD}"))


def train_all(commands, log_dir: Path):
    """(name, args, cwd) started at once; their jobs once all have ended."""
    jobs = start_all([(name, [str(TRAIN_PY), *args], cwd, clean_env()) for name, args, cwd in commands], log_dir)
    timed_out = wait_all(jobs, TIMEOUT_S)
    assert timed_out is None, timed_out
    for job in jobs:
        assert job.returncode == 0, job.tail()
        assert "Traceback" not in job.stderr, job.tail()
    return jobs


@pytest.mark.multiprocess
def test_two_runs_of_one_experiment_started_at_once_keep_their_own_files_and_resume_their_own_weights(
        tmp_path, fashion_root):
    """A seed sweep into one shared root: two runs that differ by --seed, started together, each get a folder of
    their own with every file of theirs; each then resumes its own run and ends with exactly the weights of its
    seed's uninterrupted run."""
    shared, alone = tmp_path / "shared", {seed: tmp_path / f"alone{seed}" for seed in (1, 2)}
    for folder in (shared, *alone.values()):
        folder.mkdir()
    data = ["--data_dir", str(fashion_root), *MLP]
    train_all([(f"seed{s}", [*data, "--seed", str(s), "--epochs", "1"], shared) for s in (1, 2)]
              + [(f"alone{s}", [*data, "--seed", str(s), "--epochs", "2"], alone[s]) for s in (1, 2)], tmp_path / "a")
    folders = run_folders(shared)
    assert len(folders) == 2 and {f.parent for f in folders} == {shared / "runs" / "mlp-auto-batch32-sgd"}, folders
    assert sorted(f.name.rpartition("-seed")[2] for f in folders) == ["1", "2"]
    assert [p.name for p in (shared / "runs" / "mlp-auto-batch32-sgd").iterdir() if p.is_file()] == []
    for folder in folders:
        seed = int(folder.name.rpartition("-seed")[2])
        for name in RUN_FILES:
            assert (folder / name).is_file(), (folder, name)
        assert list((folder / "checkpoints").glob("best-*.ckpt")) and list(folder.glob("events.out.tfevents.*"))
        assert json.loads((folder / runs.RECORD).read_text())["seed"] == seed
        assert f"seed_everything: {seed}" in (folder / "config.yaml").read_text()
        assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"] is not None
    train_all([(f"resume-{f.name}", [*data, "--seed", f.name.rpartition("-seed")[2], "--epochs", "2", "--ckpt_path",
                                     "last", "--run_name", f.name], shared) for f in folders], tmp_path / "b")
    assert run_folders(shared) == folders  # each resumed in its own folder
    for folder in folders:
        seed = int(folder.name.rpartition("-seed")[2])
        resumed = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
        straight = torch.load(run_folders(alone[seed])[0] / "checkpoints" / "last.ckpt", weights_only=True)
        assert resumed["global_step"] == 16
        assert_bitwise_equal(resumed, straight)
        assert len(json.loads((folder / runs.RECORD).read_text())["starts"]) == 2


@pytest.mark.multiprocess
def test_last_resumes_on_another_number_of_devices_and_the_start_block_says_what_changed(tmp_path, fashion_root):
    """2 ddp ranks, then 1 (a requeue onto fewer nodes), then 2 again: one run, one folder, each start's block names
    the run and how the world size, the effective batch and the lr changed; no Python warning about the data."""
    ddp = ["--data_dir", str(fashion_root), *MLP, "--strategy", "ddp", "--accelerator", "cpu"]
    lines = []
    for devices, epochs in ((2, 1), (1, 2), (2, 3)):
        resume = ["--ckpt_path", "last"] if epochs > 1 else []
        done = run_train([*ddp, "--devices", str(devices), "--epochs", str(epochs), *resume], tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "DataPositionWarning" not in done.stderr and "warnings.warn" not in done.stderr, done.stderr[-3000:]
        lines.append([line for line in (done.stdout + done.stderr).splitlines() if line.startswith("  run ")
                      or line.startswith("  resumed from") or line.startswith("  learning rate")])
    (folder,) = run_folders(tmp_path)
    assert lines[0][-1] == f"  run             : {folder.relative_to(tmp_path)} (new; seed 42)"
    assert lines[1][1:] == [
        f"  run             : {folder.relative_to(tmp_path)} (resumed at optimizer step 4, the newest of 1 run(s) of "
        f"this experiment with a checkpoint; seed 42)",
        "  resumed from    : 2 process(es) of 32 images a batch, effective 64 at lr 0.1 (now: as above); epoch 2 "
        "starts at its first batch"]
    assert lines[1][0] == "  learning rate   : base 0.05 at batch 32 -> 0.05 (linear scaling)"
    assert lines[2][2] == ("  resumed from    : 1 process(es) of 32 images a batch, effective 32 at lr 0.05 (now: as "
                           "above); epoch 3 starts at its first batch")
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4 + 8 + 4
    assert [s["world_size"] for s in json.loads((folder / runs.RECORD).read_text())["starts"]] == [2, 1, 2]


def test_a_root_from_before_runs_had_folders_resumes_once_and_is_left_as_it_was(tmp_path, fashion_root):
    args = ["--data_dir", str(fashion_root), *MLP]
    assert run_train([*args, "--epochs", "1"], tmp_path).returncode == 0
    (new,) = run_folders(tmp_path)
    old = tmp_path / "runs" / "mlp-single-1x32-sgd"  # the layout before: <experiment>/checkpoints, shared
    old.mkdir()
    (new / "checkpoints").rename(old / "checkpoints")
    subprocess.run(["rm", "-r", str(new.parent)], check=True)
    before = {p.name: p.stat().st_mtime_ns for p in (old / "checkpoints").iterdir()}
    done = run_train([*args, "--epochs", "2", "--ckpt_path", "last"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if line.startswith("train.py:")]
    assert notes == [f"train.py: --ckpt_path last resumes {old.absolute() / 'checkpoints' / 'last.ckpt'}, written "
                     f"before each run had a folder of its own; this run's files go to a run folder in "
                     f"{tmp_path / 'runs' / 'mlp-auto-batch32-sgd'}, and the old folder is left as it is"], done.stderr
    (resumed,) = run_folders(tmp_path)
    assert torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 16
    assert {p.name: p.stat().st_mtime_ns for p in (old / "checkpoints").iterdir()} == before


@pytest.mark.multiprocess
def test_a_name_a_running_run_holds_ends_the_second_run_in_one_line(tmp_path, fashion_root, capsys, monkeypatch):
    """While a run named sweep1 trains, a second run of that name, a resume of it, and a plain ``last`` each end in
    one line, exit 2, and write nothing."""
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--data_dir", str(fashion_root), *MLP]
    slow = [*args, "--epochs", "50", "--run_name", "sweep1", "--trainer.callbacks+=tests.recorder.SlowSteps"]
    (first,) = start_all([("first", [str(TRAIN_PY), *slow], tmp_path,
                           clean_env({"SAMPLE_RECORD_DIR": str(marks), "PYTHONPATH": str(REPO)}))], tmp_path / "logs")
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (marks / "step").exists():  # training: the run's folder is held
            assert not first.exited() and time.monotonic() < deadline, first.tail()
            time.sleep(0.2)
        monkeypatch.chdir(tmp_path)
        folder = tmp_path / "runs" / "mlp-auto-batch32-sgd" / "sweep1"
        record = (folder / runs.RECORD).read_text()
        for extra in ([], ["--ckpt_path", "last"]):  # a new run of that name; a resume of it (saved or not yet)
            assert app.main([*args, "--epochs", "50", "--run_name", "sweep1", *extra]) == 2
            errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train.py:")]
            assert len(errors) == 1 and "runs/mlp-auto-batch32-sgd/sweep1 is running now (host " in errors[0], errors
        assert app.main([*args, "--epochs", "50", "--ckpt_path", "last"]) == 2
        err = capsys.readouterr().err
        assert "train.py: error: --ckpt_path last is ambiguous: 1 run(s) of runs/mlp-auto-batch32-sgd are running " \
               "now, not as this job: sweep1 (host " in err and "Traceback" not in err, err
        assert (folder / runs.RECORD).read_text() == record and run_folders(tmp_path) == [folder]
    finally:
        stop([first])


def _create(experiment: str, queue) -> None:
    queue.put(runs.create(Path(experiment), "20261201-120000-seed1").name)


def test_runs_that_start_at_the_same_instant_get_folders_of_their_own(tmp_path):
    """Eight processes ask for one name at once: mkdir gives each its own (no listing decides)."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [context.Process(target=_create, args=(str(tmp_path / "exp"), queue)) for _ in range(8)]
    for worker in workers:
        worker.start()
    names = sorted(queue.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join()
    assert names == sorted(["20261201-120000-seed1", *(f"20261201-120000-seed1-{n}" for n in range(2, 9))])


HOLDER = """
import sys, time
from pathlib import Path
from fashion_mnist_dp.runtime import runs
runs.hold(Path(sys.argv[1]), {"seed": 1})
print("held", flush=True)
time.sleep(120)
"""


def saved_run(experiment: Path, name: str) -> Path:
    folder = experiment / name
    (folder / "checkpoints").mkdir(parents=True)
    (folder / runs.RECORD).write_text(json.dumps({"run": name, "starts": [{"jobs": []}]}))
    VerifiedCheckpointIO().save_checkpoint({"global_step": 8}, folder / "checkpoints" / "last.ckpt")
    return folder


@pytest.fixture
def held(tmp_path):
    """A run held by another process, as a running train.py holds its own."""
    folder = saved_run(tmp_path / "exp", "live")
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True,
                               cwd=REPO)
    try:
        assert process.stdout.readline() == "held\n"  # waits for the lock, however loaded the machine is
        yield folder
    finally:
        process.kill()
        process.wait()


def test_a_running_run_is_seen_as_such_and_never_shared(held):
    experiment = held.parent
    holder = runs.Run(held).holder()
    assert holder is not None and holder.startswith("host ") and ", pid " in holder
    with pytest.raises(ConfigError, match=r"--ckpt_path last is ambiguous: 1 run\(s\) of .* are running now, not as "
                                          r"this job: live \(host .*\); resume a run that has ended"):
        runs.claim(experiment, "live", True, True, "unused", {})
    with pytest.raises(ConfigError, match=r"--run_name live: run .*live is running now \(host .*\); give another"):
        runs.claim(experiment, "live", False, False, "unused", {})
    with pytest.raises(ConfigError, match=r"run .*live is running now .*: two runs never share a folder"):
        runs.hold(held, {}, wait_s=0.2)
    assert json.loads((held / runs.RECORD).read_text())["seed"] == 1  # the refused ones wrote nothing


def test_a_plain_last_beside_a_running_run_with_nothing_saved_yet_is_ambiguous_not_empty(held, monkeypatch):
    """Before the running run's first checkpoint, ``last`` is as unclear as after it: exit 2, not "nothing to resume";
    the line names the experiment as the check after a checkpoint does (below the working folder: relative)."""
    (held / "checkpoints" / "last.ckpt").unlink()
    monkeypatch.chdir(held.parent.parent)
    with pytest.raises(ConfigError, match=r"--ckpt_path last is ambiguous: 1 run\(s\) of exp are running now, not as "
                                          r"this job: live \(host "):
        resolve("last", [], experiment=held.parent.absolute(), environ={})


def test_a_run_whose_process_ended_is_free_again(tmp_path):
    folder = saved_run(tmp_path / "exp", "ended")
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from fashion_mnist_dp.runtime "
                    "import runs; runs.hold(Path(sys.argv[1]), {})", str(folder)], check=True, cwd=REPO)
    assert runs.Run(folder).holder() is None
    try:
        assert runs.claim(folder.parent, "ended", True, True, "unused", {"seed": 3}) == folder
        record = json.loads((folder / runs.RECORD).read_text())
        assert len(record["starts"]) == 3 and record["seed"] == 3 and record["run"] == "ended"
    finally:
        runs.release()
