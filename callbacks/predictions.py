"""``python train.py predict``: write every test image's predicted class to one CSV file."""

import csv
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from torchvision.datasets import FashionMNIST


class PredictionCSV(BasePredictionWriter):
    """Writes ``predictions.csv`` (index, class_id, class_name) in the run's log folder, or ``output_dir``.

    Each rank predicts its own shard; rank 0 gathers them and writes one file sorted by image index."""

    def __init__(self, output_dir: Optional[str] = None) -> None:
        super().__init__(write_interval="epoch")
        self.output_dir = output_dir

    def write_on_epoch_end(self, trainer: Trainer, pl_module: LightningModule, predictions, batch_indices) -> None:
        rows = []
        for batch_prediction, indices in zip(predictions, batch_indices[0] if batch_indices else []):
            rows.extend(zip(indices, torch.as_tensor(batch_prediction).tolist()))
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
