"""A callback that tests add through the real CLI (``--trainer.callbacks+=tests.recorder.SampleRecorder``).

Each rank writes which samples it trained and validated on to
``$SAMPLE_RECORD_DIR/rank<global rank>.json``.
"""

import json
import os
import time
from pathlib import Path

from lightning.pytorch import Callback

from tests.idx_files import sample_ids


class SampleRecorder(Callback):
    def __init__(self) -> None:
        self.train = {}  # epoch -> ids
        self.val = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train.setdefault(trainer.current_epoch, []).extend(sample_ids(batch[0]))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.val.setdefault(trainer.current_epoch, []).extend(sample_ids(batch[0]))

    def on_fit_end(self, trainer, pl_module):
        out = Path(os.environ["SAMPLE_RECORD_DIR"]) / f"rank{trainer.global_rank}.json"
        out.write_text(json.dumps({"world_size": trainer.world_size, "train": self.train, "val": self.val}))


class SlowValidation(Callback):
    """Makes every validation pass take at least ``seconds``: time the throughput figures must not count."""

    def __init__(self, seconds: float = 2.0) -> None:
        self.seconds = seconds

    def on_validation_epoch_end(self, trainer, pl_module):
        time.sleep(self.seconds)


class WeightsRecorder(Callback):
    """At the end of training, what ddp/fsdp equivalence and sharding tests compare.

    Rank 0 saves the full (gathered) weights before the first and after the last step
    to ``$SAMPLE_RECORD_DIR/initial.pt`` and ``weights.pt``; every rank writes
    ``shard<rank>.json``: the parameter and optimizer-state elements it holds itself,
    and the per-step training loss averaged over ranks.
    """

    def __init__(self) -> None:
        self.losses = []

    @staticmethod
    def _save_weights(trainer, name: str) -> None:
        import torch

        state = trainer.strategy.lightning_module_state_dict()  # a collective under fsdp
        if trainer.is_global_zero:
            torch.save({k: v.detach().cpu() for k, v in state.items()}, Path(os.environ["SAMPLE_RECORD_DIR"]) / name)

    def on_train_start(self, trainer, pl_module):
        self._save_weights(trainer, "initial.pt")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"].detach() if isinstance(outputs, dict) else outputs.detach()
        self.losses.append(float(trainer.strategy.reduce(loss, reduce_op="mean")))

    def on_train_end(self, trainer, pl_module):
        import torch

        self._save_weights(trainer, "weights.pt")
        optimizer_state = sum(
            value.numel()
            for per_param in trainer.optimizers[0].state.values()
            for value in per_param.values()
            if torch.is_tensor(value) and value.dim() > 0
        )
        record = {
            "parameters": sum(p.numel() for p in pl_module.parameters()),
            "optimizer_state": optimizer_state,
            "losses": self.losses,
        }
        (Path(os.environ["SAMPLE_RECORD_DIR"]) / f"shard{trainer.global_rank}.json").write_text(json.dumps(record))
