"""A disk that fills mid-run: every write of the run fails in turn, from that write on (tests/full_disk/ injects
ENOSPC at the Python level, so no file system of a given size is needed). Each ends with one line naming the file
that could not be written (and any write on the way out that failed too), exit 73, no traceback, no temporary file."""

import os

from tests.conftest import REPO, run_train

FULL_DISK = REPO / "tests" / "full_disk"
RUN = ["--network", "mlp", "--epochs", "1", "--batch_size", "64", "--trainer.log_every_n_steps", "2"]


def writes_of_a_run(fashion_root, cwd):
    log = cwd / "writes.log"
    result = run_train([*RUN, "--data_dir", str(fashion_root)], cwd=cwd,
                       env={"PYTHONPATH": str(FULL_DISK), "FULL_DISK_ROOT": str(cwd), "FULL_DISK_LOG": str(log)})
    assert result.returncode == 0, result.stderr[-2000:]
    return [line.split(" ", 2)[2] for line in log.read_text().splitlines()]


def shown_name(path: str) -> str:
    """What the stop line names for a write: the file, not the temporary one it goes through; for a checkpoint's
    sha256 sidecar, the checkpoint whose save failed."""
    name = os.path.basename(path)
    name = name[1:].split(".tmp-")[0] if ".tmp-" in name else name
    return name.removesuffix(".sha256")


def test_a_full_disk_at_each_write_of_a_run_ends_in_one_line_and_exit_73(fashion_root, tmp_path):
    (tmp_path / "clean").mkdir()
    writes = writes_of_a_run(fashion_root, tmp_path / "clean")
    assert len(writes) >= 8, writes  # config.yaml, hparams.yaml, metrics.csv, the checkpoints and their sha256, ...
    for at, path in enumerate(writes, 1):
        cwd = tmp_path / f"full-at-{at}"
        cwd.mkdir()
        result = run_train([*RUN, "--data_dir", str(fashion_root)], cwd=cwd,
                           env={"PYTHONPATH": str(FULL_DISK), "FULL_DISK_ROOT": str(cwd), "FULL_DISK_AT": str(at)})
        lines = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
        where = f"disk full from write {at} ({path}): {result.stderr[-1500:]}"
        assert result.returncode == 73, where
        assert len(lines) == 1 and "Traceback" not in result.stderr, where
        assert shown_name(path) in lines[0] and "No space left on device" in lines[0], where
        assert not [p for p in cwd.rglob("*") if ".tmp-" in p.name], where  # no temporary file left behind
