"""The step loop never waits on the device: a default run reads tensor values on the host at most once per 10
optimizer steps on average, over the whole process (Lightning's own logging, validation, checkpoints and the test
after fit included), and not at all between decision points."""

import json
import sys

from benchmarks.launch import REPO, clean_env, start_all, wait_all
from tests.idx_files import write_fashion_mnist

STEPS_PER_EPOCH = 469  # the default run: 60,000 images at batch 128 (here 938 at batch 2)


def test_a_default_run_reads_the_device_at_most_once_per_10_steps(tmp_path):
    data = write_fashion_mnist(tmp_path / "data", n_train=2 * STEPS_PER_EPOCH)
    out = tmp_path / "reads.json"
    # The default recipe, its learning rate known at batch 128 and scaled (linearly) to batch 2.
    argv = ["-m", "tests.host_reads", str(out), "--data_dir", str(data), "--batch_size", "2", "--model.lr_policy.base_batch_size", "128",
            "--trainer.callbacks+=tests.host_reads.PerBatch"]
    (job,) = start_all([("default_run", argv, tmp_path, clean_env({"PYTHONPATH": str(REPO)}))], tmp_path / "logs")
    assert wait_all([job], 600) is None
    record = json.loads(out.read_text())
    assert record["exit"] == 0, job.tail()
    steps = 3 * STEPS_PER_EPOCH
    reads = sum(v for k, v in record["counts"].items() if k != "host_noop")
    steady = [b for b in record["batches"] if not b["decided"]]
    print(f"{reads} host reads in {steps} optimizer steps ({reads / steps:.3f} per step): {record['counts']}; host no-ops by call: {record['noops']}",
          file=sys.stderr)
    assert len(steady) > 0.9 * steps and all(b["reads"] == 0 for b in steady), [b for b in steady if b["reads"]]
    assert reads <= steps / 10, record["counts"]
