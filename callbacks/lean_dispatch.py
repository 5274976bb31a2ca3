"""Lightning's per-step dispatch without its no-op calls: host time on every step of a small model's GPU run
(docs/benchmarks.md, "Host time per step")."""

from lightning.pytorch import Callback, LightningModule, Trainer

from fashion_mnist_dp.runtime import compat


class LeanDispatch(Callback):
    """Each callback hook is called only on the callbacks that override it (Lightning calls every callback, in a
    profiler context, for every hook: ~150 µs a step for a default run's 20), and which object runs each
    batch-transfer hook is asked once, at train start (Lightning asks at every batch). What runs, and in what order,
    is as before."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        compat.call_only_overridden_hooks(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        compat.ask_batch_hook_owners_once(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        compat.call_only_overridden_hooks(trainer, on=False)
