"""FashionMNISTClassifier: any network, its loss and metrics, and any optimizer at the learning rate of the effective
batch. The network and the optimizer are objects a config names by class path (docs/cli.md, "Your own network or
optimizer"); the learning-rate policy and the batch numbers it scales by are lr_policy.py."""

import warnings
from typing import Any, Dict, List, Literal, Optional, Union

import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, PositiveInt
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from lightning_modules.ghost_batch_norm import use_ghost_batch_norm
from lightning_modules.lr_policy import BatchPlan, LearningRates, LRPolicy, continue_schedule, describe_run
from lightning_modules.optim import check_optimizer, param_groups

NUM_CLASSES = 10


class LossWindow:
    """Step losses since a point, kept as they came (no device op, no host read per step) and summed when asked: the
    mean of a window is one stack on the device. A long window is folded into one sum (bounded memory)."""

    __slots__ = ("losses", "count")

    def __init__(self) -> None:
        self.losses: List[torch.Tensor] = []
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        self.losses.append(loss)
        self.count += 1
        if len(self.losses) >= 1024:
            self.losses = [torch.stack(self.losses).sum()]

    def mean(self) -> torch.Tensor:
        return torch.stack(self.losses).sum() / self.count


def check_network(network: nn.Module) -> None:
    """The contract of every network: a batch of ``[B, 1, 28, 28]`` images in, ``[B, 10]`` logits out. Checked when
    the module is built, before any sharding, on every rank alike (no collective, so no rank can be left waiting):
    one forward of 2 blank images in eval mode without gradients, so nothing in the network changes. A network that
    breaks it ends in one line here instead of a traceback from the loss on every rank."""
    name = f"{type(network).__module__}.{type(network).__qualname__}"
    contract = f"a network must take [B, 1, 28, 28] images and return [B, {NUM_CLASSES}] logits"
    was_training = network.training
    try:
        with torch.no_grad():
            output = network.eval()(torch.zeros(2, 1, 28, 28))
    except Exception as error:  # whatever the user's forward raises, it broke the contract
        detail = " ".join(f"{type(error).__name__}: {error}".split())
        raise MisconfigurationException(f"model.network {name} cannot take a batch of [2, 1, 28, 28] images "
                                        f"({detail[:300]}): {contract}") from error
    finally:
        network.train(was_training)
    shape = list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
    if shape != [2, NUM_CLASSES]:
        raise MisconfigurationException(f"model.network {name} returned {shape} for a batch of [2, 1, 28, 28] "
                                        f"images: {contract}")


class FashionMNISTClassifier(LightningModule):
    """Cross-entropy classifier whose learning rate follows the effective batch.

    Args:
        network: Any ``nn.Module`` from 1×28×28 images to 10 logits (lightning_modules/networks.py has the shipped
            ones; ``--network fast_cnn`` is a shorthand for their class paths).
        optimizer: The optimizer class and its own arguments (``class_path`` + ``init_args``); its ``lr`` is the base
            learning rate, its ``weight_decay`` applies to weights only, never to biases or norm weights.
        lr_policy: How the lr follows the effective batch: scaling rule, warm-up, schedule (lr_policy.py).
        batch_size: Images per device per step: linked from ``data.batch_size`` by the CLI (one value).
        virtual_devices: Devices this process stands for: linked from ``data.virtual_devices``. Every batch-norm
            then normalises each device's shard on its own, and the LR rule counts them (docs/large_batch.md).
        ghost_batch_size: Ghost batch-norm (Hoffer et al.): in training every batch-norm normalises consecutive
            sub-batches of this many images of the per-device batch, a small batch's normalisation noise at any
            batch; running statistics, evaluation and checkpoint keys are plain batch-norm's. Not with virtual
            devices, whose shards are their ghost batches already.
        label_smoothing: Cross-entropy label smoothing, 0 to 1.
        flip_test_time: Validation, test and predict average the logits of each image and its mirror image
            (a second forward pass in evaluation only).
        channels_last: NHWC weights and batches (oneDNN runs cnn 1.13-1.19x and fast_cnn 1.45-1.64x faster on CPU,
            docs/benchmarks.md; cuDNN under mixed precision); the outputs equal NCHW's up to float rounding.
        compile: ``torch.compile`` the network (the first step pays the compilation; the epoch-1 line says how long):
            ``true`` in torch's default mode, or a mode by name (``reduce-overhead``: CUDA graphs, for a small step
            bound by kernel launches; ``max-autotune``)."""

    def __init__(self, network: nn.Module, optimizer: OptimizerCallable, lr_policy: LRPolicy = LRPolicy(),
                 batch_size: PositiveInt = 128, virtual_devices: PositiveInt = 1,
                 ghost_batch_size: Optional[PositiveInt] = None,
                 label_smoothing: NonNegativeFloat = 0.0, flip_test_time: bool = False, channels_last: bool = True,
                 compile: Union[bool, Literal["default", "reduce-overhead", "max-autotune"]] = False) -> None:
        super().__init__()
        if not 0 <= label_smoothing <= 1:
            raise MisconfigurationException(f"model.label_smoothing must be between 0 and 1, got {label_smoothing}")
        try:
            check_optimizer(optimizer)
        except ValueError as error:
            raise MisconfigurationException(str(error)) from error
        # From a config, LightningCLI gives save_hyperparameters the config itself: class paths and plain values, which
        # a checkpoint keeps and loads without code. Built in Python, the objects are not hyperparameters: dropped.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`")
            self.save_hyperparameters(ignore=["batch_size", "virtual_devices"])
        objects = [name for name in ("network", "optimizer", "lr_policy") if not isinstance(self.hparams.get(name),
                                                                                              (dict, str))]
        if objects:
            for name in objects:
                del self.hparams[name]
            self.save_hyperparameters(dict(self.hparams))  # again, so the loggers' initial copy is plain too
        check_network(network)
        self.net = network
        if virtual_devices > 1 and ghost_batch_size is not None:
            raise MisconfigurationException("model.ghost_batch_size and --virtual_devices both split batch-norm's "
                                            "batches; give one of them")
        if virtual_devices > 1 or ghost_batch_size is not None:
            use_ghost_batch_norm(self.net, ghost_batch_size, virtual_devices if virtual_devices > 1 else None)
        self.optimizer_factory, self.lr_policy = optimizer, lr_policy
        self.batch_size, self.virtual_devices, self.label_smoothing = batch_size, virtual_devices, label_smoothing
        self.flip_test_time, self.compile_network = flip_test_time, compile
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.net.to(memory_format=self.memory_format)
        self._compiled_net = None  # kept out of the module tree: no second copy of every key in state_dict
        # Lightning's model summary counts FLOPs on it (in eval mode); compiling for the summary alone would be slow.
        self.example_input_array = None if compile else torch.zeros(1, 1, 28, 28)
        self.val_acc = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro")
        # No NaN check: it reads a flag back to the host per batch; a NaN loss shows as a NaN mean.
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")
        self.batch_plan: Optional[BatchPlan] = None  # set when fit configures the optimizer
        self.learning_rates: Optional[LearningRates] = None
        self._loss_window = LossWindow()  # train/loss since it was last logged
        self._loss_logged_at: Optional[int] = None  # the step it was logged at

    def configure_model(self) -> None:
        """Under ``--strategy fsdp`` (a ModelParallelStrategy: Lightning gives the module a ``device_mesh``) FSDP2
        shards the network: each layer with parameters its own unit (its weights gathered only while it runs), then
        the whole. Idempotent: Lightning calls it in every stage."""
        if self.device_mesh is None or isinstance(self.net, FSDPModule):
            return
        self.net.to(memory_format=torch.contiguous_format)  # FSDP2 shards contiguous parameters only (not NHWC)
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net.modules():
            if layer is not self.net and any(True for _ in layer.parameters(recurse=False)):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def __setattr__(self, name: str, value: Any) -> None:
        """A plain value (text, a number, None) for an attribute the module already holds is stored directly: such a
        name is in none of nn.Module's parameter, buffer and module tables, whose check costs about 1.4 µs on a 2-core
        VM, and Lightning sets the module's current hook name around each of some 40 hooks a step."""
        if type(value) in (str, int, float, bool, type(None)) and name in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        images = images.contiguous(memory_format=self.memory_format)
        if self.compile_network:
            if self._compiled_net is None:
                mode = None if self.compile_network is True else self.compile_network
                object.__setattr__(self, "_compiled_net", torch.compile(self.net, mode=mode))
            return self._compiled_net(images)
        return self.net(images)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        # forward, not self(...): the module call's hook machinery is host time on every step (no hooks are set here)
        loss = F.cross_entropy(self.forward(images), targets, label_smoothing=self.label_smoothing)
        self.log_window_mean(loss)
        return loss

    def log_window_mean(self, loss: torch.Tensor) -> None:
        """``train/loss``: the mean loss of the steps since the last logged one, logged at the steps Lightning writes
        (every ``log_every_n_steps``). A ``self.log`` costs a step more host time than a small model's GPU step
        (docs/benchmarks.md, "Host time per step"); the losses are kept as they are (no device op, no read) and
        averaged on the device at the logged step."""
        try:
            trainer = self.trainer
        except RuntimeError:  # a training_step called by hand: there is no log to write
            return
        every = trainer.log_every_n_steps
        if not every:
            return
        step = trainer.global_step
        if self._loss_logged_at is not None and self._loss_logged_at != step:  # logged at an earlier step: a new window
            self._loss_window, self._loss_logged_at = LossWindow(), None
        window = self._loss_window
        window.add(loss.detach())
        if (step + 1) % every == 0 or trainer.should_stop or trainer.fast_dev_run:
            self.log("train/loss", window.mean(), on_step=True, on_epoch=False)
            self._loss_logged_at = step  # accumulated micro-batches of this step log again

    def evaluation_logits(self, images: torch.Tensor) -> torch.Tensor:
        """Logits for evaluation: with ``flip_test_time``, the mean over each image and its mirror image, both in one
        forward (under CUDA graphs, ``compile: reduce-overhead``, a second call would overwrite the first's output)."""
        if not self.flip_test_time:
            return self(images)
        both = self(torch.cat((images, images.flip(-1))))
        return (both[:len(images)] + both[len(images):]) / 2

    def _evaluate(self, batch, accuracy: MulticlassAccuracy, mean_loss: MeanMetric, stage: str) -> torch.Tensor:
        images, targets = batch
        logits = self.evaluation_logits(images)
        # Summed per image and synced by torchmetrics at epoch end: exact for any world size.
        mean_loss.update(F.cross_entropy(logits, targets), weight=len(targets))
        accuracy.update(logits, targets)
        self.log(f"{stage}/loss", mean_loss, on_step=False, on_epoch=True)
        self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True)
        return logits

    def validation_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_acc, self.val_loss, "val")

    def test_step(self, batch, batch_idx: int) -> Dict[str, torch.Tensor]:
        """The predictions go to callbacks (callbacks/pictures.py)."""
        return {"preds": self._evaluate(batch, self.test_acc, self.test_loss, "test").argmax(dim=1)}

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self.evaluation_logits(batch[0]).argmax(dim=1)

    def configure_optimizers(self):
        """The optimizer over the weight-decay groups, at the scaled lr, with the policy's per-step schedule."""
        self.batch_plan = BatchPlan.of(self.trainer, self.batch_size, self.virtual_devices)
        optimizer = self.optimizer_factory(param_groups(self))
        self.learning_rates, scheduler = self.lr_policy.apply(optimizer, self.batch_plan)
        self._configured = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        self._optimizer_line = (f"  optimizer       : {type(optimizer).__name__}, weight decay "
                                f"{optimizer.defaults.get('weight_decay', 0):g} (not on biases and norm weights)")
        interval = "step" if self.learning_rates.per_step else "epoch"
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    def on_train_start(self) -> None:
        """A resumed fit trains with the optimizer settings configured now, at the step it resumed from: Lightning
        has put the checkpoint's param groups and scheduler over them (a new --lr would be silently dropped). For an
        unchanged config this changes nothing: the values and the lr at this step are the ones saved."""
        scheduler = self.trainer.lr_scheduler_configs[0].scheduler
        for group, configured in zip(self.trainer.optimizers[0].param_groups, self._configured):
            group.update({k: v for k, v in configured.items() if k != "lr"})
        continue_schedule(scheduler, self.trainer.global_step)

    def describe(self) -> List[str]:
        """The start block's lines of the model (once fit has configured its optimizer): the numbers users otherwise
        derive by hand."""
        plan, where = self.batch_plan, describe_run(self.trainer)
        return [f"  world size      : {plan.world_size} ({plan.devices} device(s) x {plan.num_nodes} node(s), "
                f"{where['accelerator']}, strategy {where['strategy']}, backend {where['backend']})",
                f"  batch           : {plan.describe()}", self.learning_rates.describe(plan), self._optimizer_line,
                f"  network         : {type(self.net).__name__}"]