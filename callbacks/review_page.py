"""The review page: TensorBoard's CUSTOM SCALARS layout that puts images/sec, validation accuracy and loss and where
the step time goes side by side, every run of the log folder on each chart (docs/reporting.md, "The review page").

TensorBoard fits a chart's y-axis to the points between the 5 % and 95 % quantiles of its values ("Ignore outliers
in chart scaling", on by default): a series of two or three points has none or one there, and is drawn empty, flat or
off the plot. So every chart here draws a series with a point per window of steps, or a per-epoch one beside such a
series or inside a band (validation accuracy in its 95 % interval); per-epoch figures stay on the SCALARS page."""

import math
from typing import Dict, Tuple

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.tensorboard.summary import custom_scalars

from callbacks.step_time import parts_of
from fashion_mnist_dp.runtime import compat

Z_95 = 1.959964  # the standard normal's 97.5 % quantile
ACCURACY_BAND = ("val/acc", "val/acc_low95", "val/acc_high95")


def accuracy_interval(accuracy: float, images: int, z: float = Z_95) -> Tuple[float, float]:
    """Wilson's score interval of an accuracy measured on ``images`` images: where the accuracy on other draws of as
    many images would lie (95 %), so two runs' figures can be told apart from the noise of the validation set."""
    shrink = 1 + z * z / images
    centre = (accuracy + z * z / (2 * images)) / shrink
    half = z / shrink * math.sqrt(accuracy * (1 - accuracy) / images + z * z / (4 * images * images))
    return max(centre - half, 0.0), min(centre + half, 1.0)


def accuracy_band(accuracy, images: int) -> Dict[str, float]:
    """The columns of the validation accuracy's interval; none without an accuracy or images."""
    if accuracy is None or not images:
        return {}
    return dict(zip(ACCURACY_BAND[1:], accuracy_interval(float(accuracy), images)))


def layout(breakdown: bool, ranks: int) -> Dict[str, Dict[str, list]]:
    """The page's charts (tags are regular expressions; a Margin chart names its value, lower and upper tags): the
    breakdown's parts per window between decision points when it runs, those that apply to ``ranks`` processes."""
    page = {"Throughput and accuracy": {
        "images/sec (all ranks)": ["Multiline", [r"^throughput/window/images_per_sec$"]],
        "images/sec per device": ["Multiline", [r"^throughput/window/images_per_sec_per_device$"]],
        "validation accuracy (95 % interval)": ["Margin", list(ACCURACY_BAND)],
        "loss (training, validation)": ["Multiline", [r"^train/loss$", r"^val/loss$"]]}}
    if breakdown:
        page["Step time per rank (s per window between decision points)"] = {
            part: ["Multiline", [rf"^window/{part}/rank\d+$"]] for part in parts_of(ranks)}
    return page


def write_layout(trainer: Trainer, breakdown: bool) -> None:
    """The run's page into its TensorBoard folder (rank 0), for its number of processes."""
    if trainer.is_global_zero:
        summary = custom_scalars(layout(breakdown, trainer.world_size))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                compat.write_tensorboard_summaries(logger, [summary])
