"""Fashion-MNIST files: where they are looked for, what a missing file says, and how batches are served."""

import shutil

import pytest

from datamodules.files import RAW_FILES
from tests.conftest import run_train


def test_missing_files_without_download_give_one_line_naming_folder_and_files(workdir):
    empty = workdir / "empty"
    result = run_train(["--data_dir", str(empty), "--data.download", "false"], cwd=workdir)
    assert result.returncode == 65
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1, result.stderr
    assert str(empty / "FashionMNIST" / "raw") in errors[0]
    assert all(name in errors[0] for name in RAW_FILES)
    assert "Traceback" not in result.stderr
    assert not (workdir / "runs").exists()




@pytest.mark.parametrize("unreadable", ["FashionMNIST/raw/train-labels-idx1-ubyte", "FashionMNIST"])
def test_unreadable_file_or_folder_gives_one_line_exit_65(shared_tmp, fashion_root, unreadable):
    """Run as user nobody when the suite runs as root, so that the file mode applies."""
    data = shared_tmp / "data"
    shutil.copytree(fashion_root, data)
    for path in [data, *data.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (data / unreadable).chmod(0)
    result = run_train(["--data_dir", str(data), "--data.download", "false"], cwd=shared_tmp, timeout=60,
                       unprivileged=True)
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert result.returncode == 65, result.stderr[-3000:]
    expected = ("cannot read the folder" if unreadable == "FashionMNIST" else "cannot be read (Permission denied)")
    assert len(errors) == 1 and str(data / unreadable) in errors[0] and expected in errors[0], result.stderr[-3000:]
    assert not (shared_tmp / "runs").exists()




@pytest.mark.multiprocess  # asks for several ranks (refused before they start)
def test_damaged_file_stops_a_ddp_launch_before_any_worker_starts(workdir, damaged_copy):
    """The check runs in the launching process: exit 65, no rank ever started (no "Initializing distributed"
    line, which every rank prints as it joins), nothing written. About 8 s end to end on a busy 2-core machine, nearly
    all of it importing torch, torchvision and Lightning: the timeout only keeps a hang from lasting."""
    path = damaged_copy / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-1])
    result = run_train(["--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--data_dir", str(damaged_copy)],
                       cwd=workdir, timeout=60)
    assert result.returncode == 65, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert errors == [f"train.py: error: {path.resolve()}: truncated: 263 bytes, expected 264 (8-byte header + 256); "
                      "replace it with a good copy (or delete it and rerun with network to download it again)"]
    assert "Traceback" not in result.stderr and "Initializing distributed" not in result.stderr
    assert not (workdir / "runs").exists()


def test_a_run_with_data_workers_leaves_nothing_in_the_temp_folder(workdir, fashion_root, shared_tmp):
    """Each data worker's stack file (read by the hang report) lives in its rank's own folder, removed at exit: runs
    on a shared node do not pile up files in /tmp, nor meet a file of another user's run with their pid. The temp
    folder is short-named (shared_tmp): multiprocessing puts its sockets there, and pytest's own paths are too long."""
    result = run_train(["--data_dir", str(fashion_root), "--data.num_workers", "1", "--epochs", "1",
                        "--accelerator", "cpu"], cwd=workdir, env={"TMPDIR": str(shared_tmp)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert [path.name for path in shared_tmp.iterdir() if path.name.startswith("fashion-mnist")] == []


@pytest.mark.multiprocess  # asks for several ranks (refused before they start)
def test_a_worker_init_fn_that_fails_in_a_worker_is_one_line_before_any_rank_starts(workdir, fashion_root):
    """It imports (os.system is a function) but raises in the worker: every process runs it in real workers before
    the rendezvous, so the launch ends with exit 2 and one line naming it, before any rank or file exists."""
    result = run_train(["--strategy", "ddp", "--accelerator", "cpu", "--devices", "2", "--data_dir", str(fashion_root),
                        "--data.worker_init_fn", "os.system", "--data.num_workers", "1"], cwd=workdir, timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith(
        "train.py: error: data.worker_init_fn os.system fails in a data loader worker (TypeError: "), errors
    assert "give the import path of a function that takes the worker's id, or --data.num_workers 0" in errors[0]
    assert "Traceback" not in result.stderr and "Initializing distributed" not in result.stderr
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("then, error", [("raise FileNotFoundError('seeds.txt')", "FileNotFoundError: seeds.txt"),
                                         ("time.sleep(600)", "DataLoader timed out after 2.0 seconds")])
def test_a_worker_init_fn_that_fails_after_the_default_one_ends_the_run(workdir, fashion_root, then, error):
    """A user's own worker_init_fn that calls the default first (it ignores SIGTERM) and then raises, or is still
    running at --data.worker_timeout: the check's workers are SIGKILLed at exit, so the process exits instead of
    waiting on them for ever."""
    (workdir / "user_workers.py").write_text(
        "import time\n\nfrom fashion_mnist_dp.runtime.signals import init_data_worker\n\n\n"
        f"def seed_from_file(worker_id):\n    init_data_worker(worker_id)\n    {then}\n")
    result = run_train(["--data_dir", str(fashion_root), "--data.worker_init_fn", "user_workers.seed_from_file",
                        "--data.num_workers", "1", "--data.worker_timeout", "2", "--accelerator", "cpu"],
                       cwd=workdir, timeout=60, env={"PYTHONPATH": str(workdir)})
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1].startswith("train.py: error: data.worker_init_fn user_workers.seed_from_file "
                                                     f"fails in a data loader worker ({error})"), result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not (workdir / "runs").exists()
