"""Large-batch tools that act on the network, listed in YAML like any callback (docs/large_batch.md):

    --trainer.callbacks+=callbacks.GhostBatchNorm --trainer.callbacks.ghost_batch_size 32
    --trainer.callbacks+=callbacks.GradientNoise --trainer.callbacks.eta 0.01

The math lives in lightning_modules/ghost_batch_norm.py and lightning_modules/optim.py."""

from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_modules.ghost_batch_norm import is_ghost, use_ghost_batch_norm
from datamodules.augment import run_seed
from lightning_modules.optim import add_gradient_noise
from fashion_mnist_dp.strategies import FullyShardedStrategy


class GhostBatchNorm(Callback):
    """Ghost batch-norm (Hoffer et al.): in training, every batch-norm of the model normalises consecutive sub-batches
    of ``ghost_batch_size`` images of the per-device batch, bringing back a small batch's normalisation noise at any
    batch. Running statistics, evaluation and checkpoint keys are plain batch-norm's."""

    def __init__(self, ghost_batch_size: PositiveInt = 32) -> None:
        self.ghost_batch_size = ghost_batch_size

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """At fit, before the strategy wraps the model and the optimizer takes its parameters (evaluation is plain
        batch-norm's either way)."""
        ghosts = [module for module in pl_module.modules() if is_ghost(module)]
        if any(ghost.ghost_batches is not None for ghost in ghosts):
            raise MisconfigurationException("callbacks.GhostBatchNorm and --virtual_devices both split batch-norm's "
                                            "batches; give one of them")
        if stage == "fit" and not ghosts:
            use_ghost_batch_norm(pl_module, self.ghost_batch_size)


class GradientNoise(Callback):
    """Gradient noise (Neelakantan et al.): after ddp's all-reduce and AMP's unscaling, N(0, eta / (1 + t)^gamma) is
    added to every gradient at optimizer step t, drawn from a generator seeded by (run seed, t): every rank adds the
    same noise; under fsdp the rank is mixed in, so each shard gets its own. Its std is logged as
    ``train/grad_noise_std``."""

    def __init__(self, eta: PositiveFloat = 0.01, gamma: NonNegativeFloat = 0.55) -> None:
        self.eta, self.gamma = eta, gamma

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        stream = trainer.global_rank if isinstance(trainer.strategy, FullyShardedStrategy) else 0
        std = add_gradient_noise(pl_module.parameters(), trainer.global_step, self.eta, self.gamma, seed=run_seed(),
                                 stream=stream)
        pl_module.log("train/grad_noise_std", std, on_step=True, on_epoch=False)  # same on every rank: no sync
