"""A large-batch tool that acts on the gradients, listed in YAML like any callback (docs/large_batch.md):

    --trainer.callbacks+=callbacks.GradientNoise --trainer.callbacks.eta 0.01

(ghost batch-norm is the model's ``--model.ghost_batch_size``). The math lives in lightning_modules/optim.py."""

from jsonargparse.typing import NonNegativeFloat, PositiveFloat
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import ModelParallelStrategy

from datamodules.augment import run_seed
from lightning_modules.optim import add_gradient_noise


class GradientNoise(Callback):
    """Gradient noise (Neelakantan et al.): after ddp's all-reduce and AMP's unscaling, N(0, eta / (1 + t)^gamma) is
    added to every gradient at optimizer step t, drawn from a generator seeded by (run seed, t): every rank adds the
    same noise; under fsdp the rank is mixed in, so each shard gets its own. Its std is logged as
    ``train/grad_noise_std``."""

    def __init__(self, eta: PositiveFloat = 0.01, gamma: NonNegativeFloat = 0.55) -> None:
        self.eta, self.gamma = eta, gamma

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        stream = trainer.global_rank if isinstance(trainer.strategy, ModelParallelStrategy) else 0  # fsdp
        std = add_gradient_noise(pl_module.parameters(), trainer.global_step, self.eta, self.gamma, seed=run_seed(),
                                 stream=stream)
        pl_module.log("train/grad_noise_std", std, on_step=True, on_epoch=False)  # same on every rank: no sync
