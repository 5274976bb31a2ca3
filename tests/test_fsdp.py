"""``--strategy fsdp`` (FSDP2) on CPU processes over gloo: really sharded, the same training as ddp, portable
checkpoints (the layer-wise optimizers: tests/test_fsdp_optimizers.py)."""

import subprocess
import sys

import pytest
import torch

from benchmarks.launch import REPO, free_port
from tests.conftest import FSDP_ON_CPU, run_train, experiment_dir, run_dir
from tests.test_equivalence import DDP2, MOMENTUM

pytestmark = [pytest.mark.multiprocess, FSDP_ON_CPU]

FSDP2 = ("--strategy", "fsdp", "--devices", "2", "--batch_size", "16", *MOMENTUM)
MLP_PARAMETERS = 784 * 256 + 256 + 256 * 10 + 10


@pytest.fixture(scope="module")
def fsdp(strategy_runs):
    """A 2-rank fsdp run that also tests its best checkpoint after fit, as `make train` does."""
    return strategy_runs.get(*FSDP2, "--test_after_fit", "true")


@pytest.fixture(scope="module")
def ddp(strategy_runs):
    return strategy_runs.get(*DDP2, "--batch_size", "16", *MOMENTUM)


def test_fsdp_on_cpu_runs_fsdp2_over_gloo(fsdp):
    assert "strategy fsdp, backend gloo" in fsdp.output and "FSDPMLP" in fsdp.output  # fully_shard's class
    assert "test/acc" in fsdp.output  # the test after fit, on the sharded model


def test_each_rank_holds_half_the_parameters_and_optimizer_state(fsdp, ddp):
    assert [s["parameters"] for s in ddp.shards] == [MLP_PARAMETERS] * 2
    assert [s["optimizer_state"] for s in ddp.shards] == [MLP_PARAMETERS] * 2  # one momentum buffer per weight
    assert [s["parameters"] for s in fsdp.shards] == [MLP_PARAMETERS // 2] * 2
    assert [s["optimizer_state"] for s in fsdp.shards] == [MLP_PARAMETERS // 2] * 2
    # The run reports it too (largest rank, float32).
    assert f"parameters {MLP_PARAMETERS * 4 / 2 / 2**20:.2f} MiB" in fsdp.output


def test_fsdp_trains_exactly_like_ddp(fsdp, ddp):
    assert fsdp.distance(ddp) < 1e-6
    assert fsdp.shards[0]["losses"] == pytest.approx(ddp.shards[0]["losses"], abs=1e-6)
    assert fsdp.moved() > 1e-2  # it did train


def test_a_checkpoint_saved_under_fsdp_loads_in_a_single_process(fsdp, fashion_root):
    checkpoint = run_dir(fsdp.cwd) / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    assert {k: tuple(v.shape) for k, v in saved.items()} == {k: tuple(v.shape) for k, v in fsdp.weights.items()}
    assert all(torch.equal(saved[k], fsdp.weights[k]) for k in saved)  # full, unsharded weights
    result = run_train(
        ["test", "--accelerator", "cpu", "--devices", "1", "--network", "mlp", "--data_dir", str(fashion_root),
         "--ckpt_path", str(checkpoint)],
        cwd=fsdp.cwd,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/acc" in result.stdout


def test_the_default_cnn_with_its_nhwc_weights_trains_under_fsdp(tmp_path, fashion_root):
    """FSDP2 shards contiguous parameters only: the strategy turns the NHWC (channels_last) weights back first."""
    result = run_train(["--strategy", "fsdp", "--accelerator", "cpu", "--devices", "2", "--data_dir", str(fashion_root),
                        "--epochs", "1", "--batch_size", "16", "--trainer.limit_train_batches", "2",
                        "--test_after_fit", "false"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Epoch 1:" in result.stdout


@pytest.mark.parametrize("precision, dtype", [("64-true", torch.float64), ("bf16-true", torch.bfloat16)])
def test_true_precisions_train_under_fsdp(tmp_path, fashion_root, precision, dtype):
    """The data module normalises the uint8 batch after Lightning's input conversion ran on it: it converts the
    float batch through the precision plugin itself (before: "expected scalar type Float but found Double")."""
    result = run_train(["--strategy", "fsdp", "--accelerator", "cpu", "--devices", "2", "--network", "mlp",
                        "--precision", precision, "--data_dir", str(fashion_root), "--epochs", "1", "--batch_size", "16",
                        "--trainer.limit_train_batches", "2", "--test_after_fit", "false"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Epoch 1:" in result.stdout and "Val Loss = nan" not in result.stdout, result.stdout
    state = torch.load(run_dir(tmp_path) / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert {t.dtype for t in state.values() if t.is_floating_point()} == {dtype}


@pytest.mark.parametrize("given", ["file", "hpc"])
def test_a_crafted_checkpoint_is_refused_under_fsdp_and_never_runs(tmp_path, fashion_root, given):
    """Refused before the ranks start (exit 66), as a file or as ``hpc`` (Lightning's hpc_ckpt_N.ckpt in
    default_root_dir, runs/ here); FullyShardedStrategy.load_checkpoint also loads weights_only."""
    from tests.unit.test_checkpoint_io import crafted

    ran = tmp_path / "payload-ran"
    (tmp_path / "runs").mkdir()
    path = crafted(tmp_path / ("crafted.ckpt" if given == "file" else "runs/hpc_ckpt_1.ckpt"), ran)
    result = run_train(["--strategy", "fsdp", "--accelerator", "cpu", "--devices", "2", "--network", "mlp",
                        "--data_dir", str(fashion_root), "--ckpt_path", str(path) if given == "file" else "hpc"],
                       cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert result.returncode == 66 and len(errors) == 1 and "could run code when loaded" in errors[0], result.stderr
    assert str(path) in errors[0], errors
    assert "Traceback" not in result.stderr and not ran.exists()


LOAD_IN_A_GROUP_OF_ONE = """
import sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from lightning.pytorch import LightningModule
from fashion_mnist_dp.strategies.fsdp import FullyShardedStrategy
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
module = LightningModule()
module.layer = fully_shard(torch.nn.Linear(2, 2))
strategy = FullyShardedStrategy()
strategy._lightning_module = strategy._model = module
try:
    strategy.load_checkpoint(sys.argv[1], weights_only=False)  # what a caller may ask: ignored
    print("loaded")
except Exception as error:
    print(type(error).__name__)
dist.destroy_process_group()
"""


def test_fsdp_strategy_loads_a_crafted_checkpoint_without_running_its_code(tmp_path):
    """Lightning's ModelParallelStrategy.load_checkpoint calls torch.load itself: ours always loads weights_only,
    whatever the caller asks. Here on a real FSDP2 module in a process group of one."""
    from tests.unit.test_checkpoint_io import crafted

    ran = tmp_path / "payload-ran"
    path = crafted(tmp_path / "crafted.ckpt", ran)
    result = subprocess.run([sys.executable, "-c", LOAD_IN_A_GROUP_OF_ONE, str(path), str(free_port())], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "UnpicklingError", result.stdout + result.stderr[-3000:]
    assert not ran.exists()
