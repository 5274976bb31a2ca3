"""torchrun restarts: a rank SIGKILLed after an epoch's checkpoint, the job restarted by ``torchrun --max-restarts``,
every attempt resuming from the newest checkpoint by itself (``--ckpt_path last`` in the one command), and the job
ending with exactly the weights and the final step of a clean run; TensorBoard then shows one value per step.

One job, ``RESTARTS`` restarts (10; tests/seeded_runs.py, ``FASHION_MNIST_TEST_RESTARTS=3`` for fewer): in attempt k rank 1
kills itself 2 steps after the end of epoch k+1 (tests.recorder.KillAfterCheckpoint), so attempt k+1 must start at
step 4(k+1). torchrun runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as docs/reliability.md tells users to:
without it, restarts failed to connect or hung in gloo's connect (fashion_mnist_dp/strategies/torchrun.py).
"""

import json

import pytest
import torch
from tensorboard.backend.event_processing.plugin_event_accumulator import (
    EventAccumulator as PluginAccumulator,
)
from tensorboard.util import tensor_util

from benchmarks.launch import clean_env, start_all
from fashion_mnist_dp.runtime.lifetime import DISABLE_SHARED_STORE
from tests.conftest import TRAIN_PY, experiment_dir
from tests.seeded_runs import (
    DDP,
    DETERMINISTIC_TAGS,
    RESTARTS,
    STEPS_PER_EPOCH,
    last_checkpoint,
    run_folder,
    scalars,
    wait_then_stop,
)

EPOCHS = RESTARTS + 1
TIMEOUT_S = 90 + 45 * EPOCHS  # ~10-20 s per attempt on 2 busy cores


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, fashion_root):
    """``torchrun --nproc-per-node 2 --max-restarts RESTARTS train.py ... --ckpt_path last`` with the fault injected."""
    cwd = tmp_path_factory.mktemp("restarts")
    record = cwd / "record"
    record.mkdir()
    argv = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", str(RESTARTS), str(TRAIN_PY),
            *DDP, "--data_dir", str(fashion_root), "--ckpt_path", "last",
            "--trainer.callbacks+=tests.recorder.KillAfterCheckpoint", f"--trainer.callbacks.attempts={RESTARTS}"]
    env = clean_env({"SAMPLE_RECORD_DIR": str(record), DISABLE_SHARED_STORE: "1"})
    (job,) = start_all([("torchrun", argv, cwd, env)], cwd.parent / f"{cwd.name}-logs")
    left = wait_then_stop(job, TIMEOUT_S)
    return job, record, left


@pytest.mark.multiprocess
def test_each_restart_resumes_from_the_newest_checkpoint_and_ends_as_a_clean_run(restarted, seeded_runs):
    job, record, left = restarted
    starts = {}
    for path in record.glob("attempt-*.json"):
        starts[int(path.stem.split("-")[1])] = json.loads(path.read_text())["start_step"]
    for k in range(RESTARTS + 1):  # name the first restart that broke
        assert k in starts, f"restart {k} never started training (attempts seen: {sorted(starts)}):\n{job.tail(6000)}"
        assert starts[k] == k * STEPS_PER_EPOCH, f"restart {k} resumed at step {starts[k]}, not {k * STEPS_PER_EPOCH}"
        if k < RESTARTS:
            assert (record / f"killed-{k}").exists(), f"attempt {k} was not killed"
    assert job.returncode == 0, job.tail(6000)
    assert left == [], f"processes of the job left running: {left}"
    err = job.stderr
    assert err.count("Restored all states from the checkpoint") == RESTARTS
    assert "starting a new run (torchrun attempt 1 of" in err  # --ckpt_path last with nothing saved yet
    assert "Connection refused" not in err and "connectFullMesh" not in err and "train.py: warning" not in err
    assert [line.split(":")[0] for line in job.stdout.splitlines() if line.startswith("Epoch ")] == \
        [f"Epoch {e}" for e in range(1, EPOCHS + 1)]

    restarted_ckpt = last_checkpoint(record.parent)
    clean = seeded_runs.get("ddp").checkpoint
    assert restarted_ckpt["global_step"] == clean["global_step"] == EPOCHS * STEPS_PER_EPOCH
    # Exact resume at the epoch boundary with 2 ranks, and determinism: the same seeded command twice, bitwise.
    assert clean["state_dict"].keys() == restarted_ckpt["state_dict"].keys()
    for key, value in clean["state_dict"].items():
        assert torch.equal(value, restarted_ckpt["state_dict"][key]), key
    momentum = restarted_ckpt["optimizer_states"][0]["state"]
    for index, state in clean["optimizer_states"][0]["state"].items():
        assert torch.equal(state["momentum_buffer"], momentum[index]["momentum_buffer"]), index


def plugin_scalars(folder):
    """The same through TensorBoard's own loading path (the plugin accumulator, which ignores a run's first START)."""
    accumulator = PluginAccumulator(str(folder), size_guidance={"tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()["tensors"]
            if accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"}


@pytest.mark.multiprocess
def test_tensorboard_shows_one_value_per_step_after_the_restarts(restarted, seeded_runs):
    job, record, _ = restarted
    assert job.returncode == 0, job.tail()
    runs = sorted(p.name for p in experiment_dir(record.parent).iterdir())
    assert len(runs) == 1, runs  # every attempt continued the run's folder
    folder = run_folder(record.parent)
    assert len(list(folder.glob("events.out.tfevents.*"))) == RESTARTS + 1
    clean = seeded_runs.get("ddp").scalars
    for name, found in (("EventAccumulator", scalars(folder)), ("plugin accumulator", plugin_scalars(folder))):
        for tag, points in found.items():
            values = {}
            for step, value in points:
                values.setdefault(step, set()).add(value)
            twice = {step: v for step, v in values.items() if len(v) > 1}
            assert not twice, f"{name}: {tag} has two values at steps {twice}"
        for tag in DETERMINISTIC_TAGS:  # the steps and values of a clean run, no more, no fewer
            assert found[tag] == clean[tag], f"{name}: {tag}\nrestarted {found[tag]}\nclean     {clean[tag]}"
        for tag in ("throughput/images_per_sec", "time/cumulative_s", "memory/peak_mb"):
            assert [s for s, _ in found[tag]] == [s for s, _ in clean[tag]], tag  # one point per epoch


