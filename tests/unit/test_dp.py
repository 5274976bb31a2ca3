"""``--strategy dp``: registration, the no-GPU error, batch math, the forward route, loss reduction, checkpoints.

Everything DataParallel does besides splitting over GPUs runs here on CPU: on a
machine without CUDA, ``nn.DataParallel`` simply calls its module, so a strategy
whose "GPUs" are CPU devices (``CPUSimulatedDataParallel``) runs the real code
path of DataParallelStrategy through a real Trainer. The split itself, the
gather on the root GPU and autocast in DataParallel's worker threads need GPUs:
those tests are at the end and are skipped here.
"""

import csv
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import StrategyRegistry

from callbacks import ThroughputReport
from fashion_mnist_dp.cli import app as train
from datamodules import FashionMNISTDataModule
from fashion_mnist_dp.strategies import DataParallelStrategy, register_strategies
from fashion_mnist_dp.strategies.dp import NO_GPU_MESSAGE
from tests.conftest import REPO
from tests.unit.conftest import classifier

CUDA = torch.cuda.is_available()
no_cuda_only = pytest.mark.skipif(CUDA, reason="simulates GPUs with CPU devices: nn.DataParallel is a no-op only without CUDA")


def fake_gpus(*indices):
    """``--devices 0,2`` as Lightning hands it to the strategy; building these touches no CUDA."""
    return CUDAAccelerator.get_parallel_devices(list(indices))


class CPUSimulatedDataParallel(DataParallelStrategy):
    """DataParallelStrategy with CPU devices as its 'GPUs': everything but the CUDA check is the real strategy."""

    def _require_cuda_devices(self) -> None:
        pass


# ------------------------------------------------------------------ registration and the no-GPU error


def test_dp_is_registered_idempotently():
    register_strategies()
    register_strategies()  # train.py calls it in every process; a second call must not raise
    assert "dp" in StrategyRegistry
    assert StrategyRegistry["dp"]["strategy"] is DataParallelStrategy
    assert isinstance(StrategyRegistry.get("dp"), DataParallelStrategy)


def non_seed_lines(stderr):
    # Lightning's seed_everything logs "Seed set to 42" to stderr before the Trainer is built (every error path).
    return [line for line in stderr.splitlines() if line and not line.startswith("Seed set to")]




@pytest.mark.skipif(CUDA, reason="the no-GPU error")
@pytest.mark.parametrize(
    "args",
    [
        ["--strategy", "dp", "--accelerator", "cpu"],
        ["--strategy", "dp", "--accelerator", "gpu"],  # Lightning alone would say "No supported gpu backend found!"
        ["--strategy", "dp", "--devices", "0,2"],
        ["--config", str(REPO / "configs" / "strategy" / "dp.yaml")],
        ["--strategy", "DP"],
        ["--trainer.strategy", '{"class_path": "fashion_mnist_dp.strategies.DataParallelStrategy"}'],  # the strategy's own check
    ],
    ids=lambda args: " ".join(a.replace(str(REPO) + "/", "").replace('"', "") for a in args),
)
def test_every_way_to_ask_for_dp_without_gpu_gives_the_same_line(capsys, workdir, fashion_root, args):
    code = train.main(["--data_dir", str(fashion_root), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert non_seed_lines(err) == [f"train.py: error: {NO_GPU_MESSAGE} (see python train.py --help)"], err
    assert not (workdir / "runs").exists()


@pytest.mark.skipif(CUDA, reason="the no-GPU error")
@pytest.mark.parametrize("make_strategy", [lambda: "dp", DataParallelStrategy], ids=["name", "instance"])
@pytest.mark.parametrize("accelerator", ["auto", "cpu"])
def test_trainer_refuses_dp_without_gpu_while_it_is_built(make_strategy, accelerator):
    with pytest.raises(MisconfigurationException, match="strategy dp needs CUDA GPUs"):
        Trainer(strategy=make_strategy(), accelerator=accelerator, logger=False)


@no_cuda_only
def test_dp_refuses_several_nodes():
    with pytest.raises(MisconfigurationException, match=r"one machine \(num_nodes=2\).*--strategy ddp"):
        Trainer(strategy=CPUSimulatedDataParallel(parallel_devices=[torch.device("cpu")] * 2), num_nodes=2,
                logger=False)


# ------------------------------------------------------------------ devices and batch math


def test_devices_0_2_become_device_ids_0_2_in_one_process():
    strategy = DataParallelStrategy(parallel_devices=fake_gpus(0, 2))
    assert strategy.device_ids == [0, 2]
    assert strategy.root_device == torch.device("cuda", 0)
    assert strategy.devices_per_process == 2
    assert (strategy.world_size, strategy.global_rank, strategy.is_global_zero) == (1, 0, True)


@pytest.mark.parametrize("n_gpus", [1, 2, 3])
def test_loader_yields_batch_size_times_gpus(fashion_root, n_gpus):
    strategy = DataParallelStrategy(parallel_devices=fake_gpus(*range(n_gpus)))
    # keep_on_device false: the simulated GPUs' memory does not exist, so the splits stay in host memory.
    data = FashionMNISTDataModule(data_dir=str(fashion_root), batch_size=16, eval_batch_size=20, keep_on_device=False)
    data.trainer = SimpleNamespace(strategy=strategy, world_size=strategy.world_size, global_rank=strategy.global_rank)
    data.setup("fit")
    train_loader, val_loader = data.train_dataloader(), data.val_dataloader()
    assert train_loader.batch_size == 16 * n_gpus and val_loader.batch_size == 20 * n_gpus
    sizes = [len(targets) for _, targets in train_loader]
    assert sizes[0] == 16 * n_gpus and sum(sizes) == 256  # one sampler over everything: each image once
    assert sum(len(targets) for _, targets in val_loader) == 101


# ------------------------------------------------------------------ the forward route


def routed(model, n_gpus=2):
    """A strategy set up on ``model`` as Trainer.fit would: its forward goes through nn.DataParallel."""
    strategy = DataParallelStrategy(parallel_devices=fake_gpus(*range(n_gpus)), accelerator=CPUAccelerator())
    strategy.cluster_environment = LightningEnvironment()
    strategy.connect(model)
    assert strategy._setup_model(model) is model  # the module itself is not wrapped
    return strategy


def count_calls(module):
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@no_cuda_only
def test_self_call_goes_through_data_parallel_without_recursion_and_teardown_restores_it():
    torch.manual_seed(0)
    model = classifier("cnn").eval()  # no dropout: the same input gives the same logits
    images = torch.randn(8, 1, 28, 28)
    expected = model(images)
    keys = list(model.state_dict())

    strategy = routed(model)
    data_parallel = strategy._data_parallel
    assert isinstance(data_parallel, torch.nn.DataParallel) and data_parallel.module.module is model
    through_wrapper = count_calls(data_parallel.module)
    assert "forward" in model.__dict__
    torch.testing.assert_close(model(images), expected)
    assert len(through_wrapper) == 1  # self(x) went through DataParallel, once
    assert list(model.state_dict()) == keys == list(strategy.lightning_module_state_dict())

    # A replica (what DataParallel makes per GPU) shares the routed forward in its __dict__; the
    # wrapper must call the class's forward on it, not re-enter DataParallel.
    replica = model._replicate_for_data_parallel()
    assert replica.__dict__["forward"] is model.__dict__["forward"]
    torch.testing.assert_close(type(data_parallel.module)(replica)(images), expected)
    assert len(through_wrapper) == 1

    strategy.teardown()
    assert "forward" not in model.__dict__ and strategy._data_parallel is None
    torch.testing.assert_close(model(images), expected)
    assert len(through_wrapper) == 1


@no_cuda_only
def test_setting_up_twice_routes_once():
    model = classifier("cnn")
    strategy = routed(model)
    strategy._setup_model(model)  # fit, then test: setup runs again
    calls = count_calls(strategy._data_parallel.module)
    model(torch.randn(2, 1, 28, 28))
    assert len(calls) == 1
    strategy.teardown()
    assert "forward" not in model.__dict__


# ------------------------------------------------------------------ loss reduction


@no_cuda_only
@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
@pytest.mark.parametrize("batch, n_gpus", [(12, 3), (10, 3), (10, 4), (7, 2)])
def test_loss_over_gathered_logits_is_the_chunk_weighted_mean_of_per_gpu_losses(batch, n_gpus, monkeypatch):
    """What dp computes once (training_step over the gathered logits) against what each GPU would compute.

    DataParallel scatters like ``torch.chunk``: 10 images over 4 GPUs are chunks of 3, 3, 3, 1.
    Lightning 1.x averaged the per-GPU losses with equal weights, which is wrong for such uneven chunks.
    Without CUDA nn.DataParallel calls its module on the whole batch, so that a loss taken per call could not be
    told from one taken over the gathered logits: here its forward does on CPU what it does over GPUs (scatter
    by torch.chunk, the module once per chunk, gather by concatenation), and the test checks it was used.
    """
    seen = []

    def scatter_apply_gather(self, images):
        chunks = images.chunk(n_gpus)  # without CUDA, DataParallel keeps no device_ids
        seen.append([len(c) for c in chunks])
        return torch.cat([self.module(c) for c in chunks])

    monkeypatch.setattr(torch.nn.DataParallel, "forward", scatter_apply_gather)
    torch.manual_seed(batch)
    # eval: an image's logits do not depend on the chunk it lands in. In train mode BatchNorm normalises
    # each GPU's chunk with that chunk's statistics (as in ddp without sync_batchnorm); that needs real GPUs.
    model = classifier("cnn").eval()
    images, targets = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    chunks = list(zip(images.chunk(n_gpus), targets.chunk(n_gpus)))
    per_gpu = torch.stack([F.cross_entropy(model.net(x), y) for x, y in chunks])
    sizes = torch.tensor([len(y) for _, y in chunks], dtype=per_gpu.dtype)

    routed(model, n_gpus)
    loss = model.training_step((images, targets), 0)
    assert seen == [sizes.int().tolist()]  # the step's forward went through DataParallel's chunks
    torch.testing.assert_close(loss, (per_gpu * sizes).sum() / sizes.sum())
    if len(set(sizes.tolist())) > 1:  # equal weights would be caught
        assert not torch.allclose(loss, per_gpu.mean())


# ------------------------------------------------------------------ a real Trainer: fit, validate, checkpoints


class Recorder(Callback):
    def __init__(self):
        self.train_batches, self.val_batches, self.routed_calls_per_step = [], [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        assert "forward" in pl_module.__dict__
        self.train_batches.append(len(batch[1]))
        self.before = len(trainer.strategy._calls)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.routed_calls_per_step.append(len(trainer.strategy._calls) - self.before)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        assert "forward" in pl_module.__dict__
        if not trainer.sanity_checking:
            self.val_batches.append(len(batch[1]))


class CountingSimulatedDataParallel(CPUSimulatedDataParallel):
    """Counts the calls that reach the DataParallel wrapper."""

    def _setup_model(self, model):
        model = super()._setup_model(model)
        self._calls = count_calls(self._data_parallel.module)
        return model


@no_cuda_only
def test_fit_with_simulated_gpus_batch_math_metrics_and_a_checkpoint_that_loads_without_dp(tmp_path, fashion_root):
    torch.manual_seed(0)
    n_gpus, batch_size = 3, 16
    strategy = CountingSimulatedDataParallel(parallel_devices=[torch.device("cpu")] * n_gpus)
    recorder = Recorder()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    trainer = Trainer(strategy=strategy, max_epochs=1, logger=CSVLogger(tmp_path), enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[recorder, checkpoint, ThroughputReport()])
    model = classifier("cnn", lr=0.01, batch_size=batch_size)
    data = FashionMNISTDataModule(data_dir=str(fashion_root), batch_size=batch_size, eval_batch_size=20)
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    trainer.fit(model, datamodule=data)

    assert (trainer.num_devices, trainer.world_size, trainer.num_nodes) == (n_gpus, 1, 1)
    assert recorder.train_batches == [48] * 5 + [16] and recorder.routed_calls_per_step == [1] * 6
    assert recorder.val_batches == [60, 41]  # every test image once
    plan = model.batch_plan
    assert (plan.devices, plan.devices_per_process, plan.world_size) == (n_gpus, n_gpus, 1)
    assert plan.batch_size_per_device == batch_size and plan.effective_batch_size == batch_size * n_gpus
    assert model.learning_rates.scaled_lr == pytest.approx(0.01 * n_gpus)  # linear rule over the effective batch
    assert 0.0 <= trainer.callback_metrics["val/acc"] <= 1.0 and torch.isfinite(trainer.callback_metrics["val/loss"])
    assert any(not torch.equal(initial[k], v) for k, v in model.state_dict().items())  # it trained
    rows = csv.DictReader((tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines())
    (logged,) = [row for row in rows if row["throughput/images_per_sec"]]
    per_device = float(logged["throughput/images_per_sec"]) / n_gpus  # one process, but 3 devices
    assert float(logged["throughput/images_per_sec_per_device"]) == pytest.approx(per_device)
    assert "forward" not in model.__dict__  # teardown removed the route

    # The checkpoint is a plain LightningModule checkpoint: it loads strictly into a model that never saw dp.
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert list(saved["state_dict"]) == list(classifier("cnn").state_dict())
    plain = classifier("cnn")
    plain.load_state_dict(saved["state_dict"])
    images = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(plain.eval()(images), model.eval()(images))

    # validate after fit: set up (and routed) again, and the metric sees every image once
    recorder.val_batches.clear()
    (metrics,) = trainer.validate(model, datamodule=data, verbose=False)
    assert recorder.val_batches == [60, 41] and "val/acc" in metrics
    assert "forward" not in model.__dict__


# ------------------------------------------------------------------ on GPUs only (skipped without CUDA)

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 CUDA GPUs")


@two_gpus
def test_gpu_forward_is_split_over_the_gpus_and_gathered_on_the_root():
    n_gpus = torch.cuda.device_count()
    model = classifier("cnn").cuda().eval()  # eval: logits independent of the chunking (BatchNorm)
    images = torch.randn(8 * n_gpus, 1, 28, 28, device="cuda:0")
    expected = model(images)
    seen = []
    model.net.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].device))
    strategy = DataParallelStrategy(parallel_devices=fake_gpus(*range(n_gpus)), accelerator=CUDAAccelerator())
    strategy.connect(model)
    strategy._setup_model(model)
    logits = model(images)
    assert logits.device == torch.device("cuda", 0)
    torch.testing.assert_close(logits, expected, rtol=1e-3, atol=1e-3)
    assert sorted(d.index for d in seen) == list(range(n_gpus))  # one chunk per GPU

    # bf16 autocast reaches DataParallel's worker threads (they would otherwise compute in float16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert model(images).dtype == torch.bfloat16
    strategy._restore_forward()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_fit_with_dp_over_every_gpu(tmp_path, fashion_root):
    n_gpus = torch.cuda.device_count()
    batches = []

    class Sizes(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            assert "forward" in pl_module.__dict__
            batches.append(len(batch[1]))

    trainer = Trainer(strategy="dp", accelerator="gpu", devices=-1, max_epochs=1, logger=False,
                      enable_progress_bar=False, default_root_dir=tmp_path, callbacks=[Sizes()])
    model = classifier("cnn", batch_size=16)
    trainer.fit(model, datamodule=FashionMNISTDataModule(data_dir=str(fashion_root), batch_size=16))
    assert trainer.num_devices == n_gpus and batches[0] == 16 * n_gpus
    assert model.batch_plan.effective_batch_size == 16 * n_gpus
    assert "forward" not in model.__dict__
