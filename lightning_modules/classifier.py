"""FashionMNISTClassifier: the network, its loss and metrics, and the optimizer for the effective batch."""

import math
import os
import re
from functools import partial
from typing import Any, Dict, Literal, Optional

import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.tensorboard.summary import hparams as tensorboard_hparams
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from lightning_modules.batch_plan import BatchPlan, format_plan
from lightning_modules.ghost_batch_norm import use_ghost_batch_norm
from lightning_modules.networks import (NUM_CLASSES, build_network, freeze_norm_scales, init_convs_as_identity,
                                        init_first_conv_as_whitening)
from lightning_modules.optim import (OptimizerName, ScalingRule, ScheduleName, add_gradient_noise, build_optimizer,
                                     lr_factor, param_groups)
from lightning_modules.test_time import augmented_logits
from runtime import compat
from strategies import FullyShardedStrategy

# Training images whose patches the whitening init (model.whitening_init) is computed from: airbench's count.
WHITENING_IMAGES = 5000


class FashionMNISTClassifier(LightningModule):
    """Cross-entropy classifier whose learning rate follows the effective batch.

    Args:
        batch_size: Images per device per step: linked from ``data.batch_size`` by the CLI (one value).
        network: ``cnn`` (small, fast on CPU), ``fast_cnn`` (a quarter of cnn's work: CPU time-to-accuracy),
            ``gpu_cnn`` (six times cnn's work, which a GPU barely notices: GPU time-to-accuracy),
            ``mlp`` (no batch-norm or dropout: ddp-equivalence checks),
            ``wrn`` (the DLI workshop's WideResNet) or ``resnet18``.
        optimizer: ``sgd`` (see momentum, nesterov), ``adamw``, ``novograd``, ``lamb`` or ``lars``.
        base_lr: Learning rate known to work at ``base_batch_size``.
        base_batch_size: Batch that ``base_lr`` was tuned for. Default: the per-device batch,
            i.e. base_lr is the single-device recipe's learning rate.
        lr_scaling: How the learning rate follows the effective batch: ``none``, ``linear`` or ``sqrt``.
        warmup_epochs: Epochs (fractions allowed) over which the learning rate climbs from base_lr
            to the scaled lr, stepped per optimizer step.
        schedule: After warm-up: ``constant``, ``cosine`` (to zero at the last step) or ``step``.
        lr_step_epochs: For ``step``: epochs between decays.
        lr_gamma: For ``step``: factor applied at each decay.
        momentum: Momentum for ``sgd`` and ``lars``, 0 <= momentum < 1.
        nesterov: Nesterov momentum for ``sgd`` and ``lars`` (needs momentum > 0).
        weight_decay: Decoupled for adamw, L2 otherwise; never applied to biases or norm weights.
        bias_lr_scale: Biases and norm weights learn at the lr times this (warm-up and schedule apply to both).
        label_smoothing: Cross-entropy label smoothing.
        ghost_batch_size: Ghost batch-norm: every batch-norm of the network normalises virtual sub-batches of
            this many samples (of the per-device batch) in training; ``None``: plain batch-norm. Running
            statistics, evaluation and checkpoint keys are unchanged (lightning_modules/ghost_batch_norm.py).
        virtual_devices: One process stands for this many devices at the per-device batch (docs/large_batch.md):
            it trains on their shards at once (batch N×B, in rank order), every batch-norm normalises each shard
            on its own, and the LR rule counts them. 1: off.
        grad_noise_eta: Gradient noise (Neelakantan et al.): after backward, N(0, eta / (1 + t)^gamma) is added
            to every gradient, t = optimizer step (0-based). 0: off.
        grad_noise_gamma: Decay exponent of the gradient-noise variance.
        warmup_start_lr: Learning rate at the first warm-up step. Default: base_lr (the workshop's warm-up
            from the single-device lr to the scaled one). Set it lower for a one-cycle style ramp.
        channels_last: Keep weights and batches in NHWC memory format (faster convolutions with
            cuDNN under mixed precision, and with oneDNN on CPU). configs/default.yaml turns it on;
            the outputs equal NCHW's up to float rounding.
        compile: ``torch.compile`` the network (first steps pay the compilation; the epoch-1 line says how long).
        dirac_init: Convolutions with as many outputs as inputs or more start as the identity on their first
            filters (airbench's init; networks.init_convs_as_identity).
        freeze_norm_weights: Batch-norm scales stay at 1, only their biases train (airbench's).
        whitening_init: The first convolution starts as patch whitening of the first 5,000 training images
            (airbench's; networks.patch_whitening_filters), computed when fit starts (a resume loads its weights).
        flip_test_time: Validation, test and predict average the logits of each image and its mirror image
            (test-time augmentation; costs a second forward pass in evaluation only, none in training).
        translate_test_time: Evaluation also averages in the image shifted by one pixel both ways (airbench's
            test-time augmentation; three times the evaluation passes, none in training).
    """

    def __init__(
        self,
        batch_size: PositiveInt = 128,
        network: Literal["cnn", "fast_cnn", "gpu_cnn", "mlp", "wrn", "resnet18"] = "cnn",
        optimizer: OptimizerName = "sgd",
        base_lr: PositiveFloat = 0.05,
        base_batch_size: Optional[PositiveInt] = None,
        lr_scaling: ScalingRule = "linear",
        warmup_epochs: NonNegativeFloat = 0.0,
        schedule: ScheduleName = "constant",
        lr_step_epochs: PositiveFloat = 10.0,
        lr_gamma: PositiveFloat = 0.1,
        momentum: NonNegativeFloat = 0.9,
        nesterov: bool = False,
        weight_decay: NonNegativeFloat = 5e-4,
        bias_lr_scale: PositiveFloat = 1.0,
        label_smoothing: NonNegativeFloat = 0.0,
        ghost_batch_size: Optional[PositiveInt] = None,
        virtual_devices: PositiveInt = 1,
        grad_noise_eta: NonNegativeFloat = 0.0,
        grad_noise_gamma: NonNegativeFloat = 0.55,
        warmup_start_lr: Optional[PositiveFloat] = None,
        channels_last: bool = False,
        compile: bool = False,
        flip_test_time: bool = False,
        dirac_init: bool = False,
        freeze_norm_weights: bool = False,
        whitening_init: bool = False,
        translate_test_time: bool = False,
    ) -> None:
        super().__init__()
        if nesterov and momentum <= 0:
            raise MisconfigurationException("model.nesterov=true needs model.momentum > 0 (e.g. --model.momentum 0.9)")
        # jsonargparse's PositiveFloat / NonNegativeFloat let inf through (and the schedule then overflows).
        for key, value in (("base_lr", base_lr), ("warmup_epochs", warmup_epochs), ("lr_step_epochs", lr_step_epochs),
                           ("lr_gamma", lr_gamma), ("momentum", momentum), ("weight_decay", weight_decay),
                           ("bias_lr_scale", bias_lr_scale), ("label_smoothing", label_smoothing),
                           ("warmup_start_lr", warmup_start_lr or 1.0)):
            if not math.isfinite(value):
                raise MisconfigurationException(f"model.{key} must be a finite number, got {value}")
        if label_smoothing > 1:
            raise MisconfigurationException(f"model.label_smoothing must be between 0 and 1, got {label_smoothing}")
        if momentum >= 1:
            raise MisconfigurationException(f"model.momentum must be >= 0 and < 1 (e.g. 0.9), got {momentum}")
        self.save_hyperparameters(ignore=["batch_size"])  # the data's setting, logged with the batch plan
        self.batch_size = batch_size
        self.net = build_network(network, NUM_CLASSES)
        if ghost_batch_size is not None and virtual_devices > 1:
            raise MisconfigurationException("model.ghost_batch_size and model.virtual_devices both split batch-norm's "
                                            "batches; give one of them")
        if ghost_batch_size is not None or virtual_devices > 1:
            use_ghost_batch_norm(self.net, ghost_batch_size, virtual_devices if virtual_devices > 1 else None)
        if dirac_init:
            init_convs_as_identity(self.net)
        if freeze_norm_weights:
            freeze_norm_scales(self.net)
        if whitening_init and not any(isinstance(m, torch.nn.Conv2d) for m in self.net.modules()):
            raise MisconfigurationException(f"model.whitening_init needs a convolutional network; {network} has no "
                                            f"convolution (use e.g. fast_cnn, or leave whitening_init off)")
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        if channels_last:
            self.net.to(memory_format=torch.channels_last)
        # The compiled wrapper is kept out of the module tree (no second copy of every key in state_dict).
        self._compiled_net = None
        # Lightning's model summary counts FLOPs on it (in eval mode: nothing trained, nothing drawn); compiling
        # for the summary alone would cost a compilation.
        self.example_input_array = None if compile else torch.zeros(1, 1, 28, 28)
        self.val_acc = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro")
        # No NaN check: it reads a flag back to the host per batch; a NaN loss shows as a NaN mean.
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")
        self.batch_plan: Optional[BatchPlan] = None
        self.run_facts: Dict[str, Any] = {}

    def configure_model(self) -> None:
        """Under ``--strategy fsdp`` the strategy shards the network here (strategies/fsdp.py)."""
        if isinstance(self._trainer.strategy if self._trainer else None, FullyShardedStrategy):
            self._trainer.strategy.shard(self.net)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        images = images.contiguous(memory_format=self.memory_format)
        if self.hparams.compile:
            if self._compiled_net is None:
                object.__setattr__(self, "_compiled_net", torch.compile(self.net))
            return self._compiled_net(images)
        return self.net(images)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        loss = F.cross_entropy(self(images), targets, label_smoothing=self.hparams.label_smoothing)
        self.log("train/loss", loss, on_step=True, on_epoch=False, batch_size=len(targets))
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """Gradient noise after ddp's all-reduce (done inside backward) and AMP's unscaling, seeded by (run seed, step):
        every rank adds the same noise; under fsdp the rank is mixed in, so each shard gets its own."""
        hp = self.hparams
        if hp.grad_noise_eta > 0:
            trainer = self.trainer
            stream = trainer.global_rank if isinstance(trainer.strategy, FullyShardedStrategy) else 0
            seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # set on every rank by seed_everything
            std = add_gradient_noise(self.parameters(), trainer.global_step, hp.grad_noise_eta, hp.grad_noise_gamma,
                                     seed=seed, stream=stream)
            self.log("train/grad_noise_std", std, on_step=True, on_epoch=False)  # same on every rank: no sync

    def evaluation_logits(self, images: torch.Tensor) -> torch.Tensor:
        """Logits for evaluation, averaged over the test-time views the options ask for (test_time.py)."""
        return augmented_logits(self, images, self.hparams.flip_test_time, self.hparams.translate_test_time)

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

    # ------------------------------------------------------------------ optimizer and learning rate

    def setup(self, stage: str) -> None:
        """The batch plan, once the trainer knows the world and the data module its training images."""
        trainer, hp = self.trainer, self.hparams
        datamodule = getattr(trainer, "datamodule", None)
        self.batch_plan = BatchPlan.build(
            batch_size_per_device=self.batch_size, devices=trainer.num_devices, num_nodes=trainer.num_nodes,
            world_size=trainer.world_size, accumulate=trainer.accumulate_grad_batches,
            devices_per_process=getattr(trainer.strategy, "devices_per_process", 1), base_lr=hp.base_lr,
            base_batch_size=hp.base_batch_size, lr_scaling=hp.lr_scaling, warmup_epochs=hp.warmup_epochs,
            train_images=getattr(datamodule, "train_images", None) if stage == "fit" else None,
            limit_train_batches=trainer.limit_train_batches, max_epochs=trainer.max_epochs, max_steps=trainer.max_steps,
            virtual_devices=hp.virtual_devices)
        if stage == "fit" and hp.whitening_init:
            self._init_whitening(datamodule)

    def _init_whitening(self, datamodule) -> None:
        """Before the strategy wraps or shards the network, so every rank starts from the same filters."""
        if not hasattr(datamodule, "normalised_train_images"):
            raise MisconfigurationException("model.whitening_init needs a data module with normalised_train_images "
                                            "(datamodules.FashionMNISTDataModule has it)")
        init_first_conv_as_whitening(self.net, datamodule.normalised_train_images(WHITENING_IMAGES))

    def configure_optimizers(self):
        hp, plan = self.hparams, self.batch_plan
        optimizer = build_optimizer(
            hp.optimizer, param_groups(self, hp.weight_decay, plan.scaled_lr, hp.bias_lr_scale), lr=plan.scaled_lr,
            momentum=hp.momentum,
            nesterov=hp.nesterov)
        factor = partial(
            lr_factor,
            warmup_steps=plan.warmup_steps,
            warmup_start_factor=(hp.warmup_start_lr or hp.base_lr) / plan.scaled_lr,
            total_steps=plan.total_steps,
            schedule=hp.schedule,
            step_size=max(1, round(hp.lr_step_epochs * max(plan.steps_per_epoch, 1))),
            gamma=hp.lr_gamma,
        )
        strategy = self.trainer.strategy
        self.run_facts = {
            "accelerator": type(self.trainer.accelerator).__name__.replace("Accelerator", "").lower(),
            "strategy": strategy_label(strategy),
            "backend": getattr(strategy, "process_group_backend", None) or "none",
        }
        rank_zero_info(format_plan(plan, optimizer=hp.optimizer, schedule=hp.schedule, **self.run_facts))
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": LambdaLR(optimizer, factor), "interval": "step"},
        }

    def on_fit_start(self) -> None:
        """Log the plan's numbers (world size, effective batch, scaled lr...) with the hyperparameters."""
        params = compat.public_hparams({**self.hparams, **self.batch_plan.as_dict(), **self.run_facts})
        for logger in self.loggers:
            logger.log_hyperparams(params)  # hparams.yaml
            if isinstance(logger, TensorBoardLogger) and self.trainer.is_global_zero:
                write_tensorboard_hparams(logger, params, metrics=("val/acc", "val/loss", "throughput/images_per_sec"))


def strategy_label(strategy) -> str:
    """The registry name users type (``fsdp``, ``dp``), else ``DDPStrategy`` -> ``ddp``."""
    registered = getattr(type(strategy), "strategy_name", None)
    if registered:
        return registered
    name = type(strategy).__name__.removesuffix("Strategy")
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()


def write_tensorboard_hparams(logger: TensorBoardLogger, params: Dict[str, Any], metrics) -> None:
    """Fill TensorBoard's HPARAMS tab, its columns tied to scalar tags the run logs anyway (``log_hyperparams`` with
    metrics would write each metric as a fake scalar at step 0)."""
    clean = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in params.items()}
    compat.write_tensorboard_summaries(logger, tensorboard_hparams(clean, {name: 0.0 for name in metrics}))
