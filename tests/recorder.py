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
