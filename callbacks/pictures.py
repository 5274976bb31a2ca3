"""Pictures of a test run in TensorBoard: the confusion matrix, misclassified test images with their true and
predicted classes, and the accuracy of each class as scalars; computed once at the end of the test (the test after
fit, or ``train.py test``), never per step."""

from typing import List, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics.classification import MulticlassConfusionMatrix
from torchvision.datasets import FashionMNIST

from datamodules.fashion_mnist import PIXEL_MEAN, PIXEL_STD

CLASSES = FashionMNIST.classes


class TestPictures(Callback):
    """Logs ``test/confusion_matrix`` and ``test/misclassified`` (figures) and ``test/acc_class/<class>``.

    Args:
        misclassified: How many misclassified images (rank 0's, in test order) the grid shows."""

    def __init__(self, misclassified: int = 32) -> None:
        self.misclassified = misclassified
        self._matrix: Optional[MulticlassConfusionMatrix] = None
        self._wrong: List[tuple] = []  # (image, true, predicted) on rank 0

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._matrix = MulticlassConfusionMatrix(num_classes=len(CLASSES)).to(pl_module.device)
        self._wrong = []

    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        if not isinstance(outputs, dict) or "preds" not in outputs:
            return
        images, targets = batch
        predicted = outputs["preds"]
        self._matrix.update(predicted, targets)
        if trainer.is_global_zero and len(self._wrong) < self.misclassified:  # test-time reads, until there are enough
            wrong = (predicted != targets).nonzero().flatten()[: self.misclassified - len(self._wrong)]
            labels = torch.stack([targets[wrong], predicted[wrong]], dim=1).tolist()
            self._wrong += [(image, true, guess)
                            for image, (true, guess) in zip(images[wrong, 0].float().cpu(), labels)]

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        matrix = self._matrix.compute()  # synced over ranks by torchmetrics: every rank takes part
        loggers = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        if not trainer.is_global_zero or not loggers:
            return
        counts = matrix.tolist()  # one read; torchmetrics' own plot reads every cell
        per_class = [row[i] / max(sum(row), 1) for i, row in enumerate(counts)]
        for logger in loggers:
            writer, step = logger.experiment, trainer.global_step
            writer.add_figure("test/confusion_matrix", self._matrix_figure(counts), step)
            writer.add_figure("test/misclassified", self._grid(), step)
            logger.log_metrics({f"test/acc_class/{name.replace('/', '-')}": acc
                                for name, acc in zip(CLASSES, per_class)}, step)

    @staticmethod
    def _matrix_figure(counts):
        from matplotlib.figure import Figure  # no pyplot: no global state, no display

        figure = Figure(figsize=(9, 8), layout="constrained")
        axes = figure.add_subplot()
        axes.imshow(counts, cmap="viridis")
        top = max(max(row) for row in counts) or 1
        for true, row in enumerate(counts):
            for predicted, n in enumerate(row):
                axes.text(predicted, true, str(n), ha="center", va="center", fontsize=9,
                          color="black" if n > top / 2 else "white")
        axes.set_xticks(range(len(CLASSES)), CLASSES, rotation=45, ha="right")
        axes.set_yticks(range(len(CLASSES)), CLASSES)
        axes.set_xlabel("predicted class")
        axes.set_ylabel("true class")
        return figure

    def _grid(self):
        from matplotlib.figure import Figure

        columns = 8
        rows = max(1, -(-len(self._wrong) // columns))
        figure = Figure(figsize=(2 * columns, 2.3 * rows), layout="constrained")
        for i, (image, true, predicted) in enumerate(self._wrong):
            axes = figure.add_subplot(rows, columns, i + 1)
            axes.imshow((image * PIXEL_STD + PIXEL_MEAN).clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
            axes.set_title(f"{CLASSES[true]}\n→ {CLASSES[predicted]}", fontsize=8)
            axes.axis("off")
        return figure
