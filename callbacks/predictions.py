"""``python train.py predict``: write every test image's predicted class to one CSV file."""

import csv
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from torchvision.datasets import FashionMNIST


class PredictionCSV(Callback):
    """Writes ``predictions.csv`` (index, class_id, class_name) in the run's log folder, or ``output_dir``.

    Each rank predicts its own shard; rank 0 gathers them and writes one file sorted by image index. A shard's image
    indices are its loader's batches in order (the data module's eval sampler: no shuffle, no padded duplicates), so
    this needs none of Lightning's prediction-writer bookkeeping, which only serves writers listed at the top of
    trainer.callbacks (this one is a part of callbacks.Report)."""

    def __init__(self, output_dir: Optional[str] = None) -> None:
        self.output_dir = output_dir

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loaders = trainer.predict_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        indices = [index for batch in loader.batch_sampler for index in batch]
        classes = [c for batch in trainer.predict_loop.predictions for c in torch.as_tensor(batch).tolist()]
        rows = list(zip(indices, classes))
        folder = Path(self.output_dir or trainer.log_dir or ".")  # log_dir is a collective: every rank asks
        if dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, rows)
            rows = [row for part in gathered for row in part]
        if not trainer.is_global_zero:
            return
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "predictions.csv"
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", "class_id", "class_name"])
            for index, class_id in sorted(rows):
                writer.writerow([index, class_id, FashionMNIST.classes[class_id]])
        print(f"Wrote {len(rows)} predictions to {path}", flush=True)
