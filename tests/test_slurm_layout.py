"""Under srun, a task layout the Trainer cannot use ends every task with exit 2 and one line from rank 0, no
traceback (SLURM's variables as srun sets them; the real srun is in docs/running-on-clusters.md)."""

import pytest

from benchmarks.launch import clean_env
from tests.conftest import run_train

SRUN_N2 = {"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # `srun -n 2`: no SLURM_NTASKS_PER_NODE


@pytest.mark.multiprocess  # --devices 2, refused before any second process starts
@pytest.mark.parametrize("rank", ["0", "1"])
def test_srun_n_without_tasks_per_node_is_one_line_from_rank_0_and_exit_2_on_every_task(rank, workdir, fashion_root):
    env = clean_env({**SRUN_N2, "SLURM_PROCID": rank, "SLURM_LOCALID": rank})
    done = run_train(["--data_dir", str(fashion_root), "--strategy", "ddp", "--devices", "2", "--accelerator", "cpu"],
                     workdir, env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("train.py: error:")]
    if rank == "0":
        assert len(lines) == 1 and "without --ntasks-per-node" in lines[0] and "--ntasks-per-node 2" in lines[0]
    else:
        assert lines == []
    assert not (workdir / "runs").exists()  # nothing written
