"""The review page: TensorBoard's CUSTOM SCALARS layout that puts images/sec (and the FLOP/s and MFU they come to),
validation accuracy and loss and where the step time goes side by side, every run of the log folder on each chart
(docs/reporting.md, "The review page").

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


def layout(breakdown: bool, ranks: int, flops: bool = False, mfu: bool = False) -> Dict[str, Dict[str, list]]:
    """The page's charts (tags are regular expressions; a Margin chart names its value, lower and upper tags): the
    achieved FLOP/s per device where the run's FLOPs were counted, MFU where the device's peak is known too; the
    breakdown's parts per window between decision points when it runs, those that apply to ``ranks`` processes."""
    window = r"^throughput/window/"
    page = {"Throughput and accuracy": {
        "images/sec (all ranks)": ["Multiline", [rf"{window}images_per_sec$"]],
        "images/sec per device": ["Multiline", [rf"{window}images_per_sec_per_device$"]],
        **({"FLOP/s per device (achieved)": ["Multiline", [rf"{window}flops_per_sec_per_device$"]]} if flops else {}),
        **({"MFU (of one device's peak)": ["Multiline", [rf"{window}mfu$"]]} if mfu else {}),
        "validation accuracy (95 % interval)": ["Margin", list(ACCURACY_BAND)],
        "loss (training, validation)": ["Multiline", [r"^train/loss$", r"^val/loss$"]]}}
    if breakdown:
        page["Step time per rank (s per window between decision points)"] = {
            part: ["Multiline", [rf"^window/{part}/rank\d+$"]] for part in parts_of(ranks)}
    return page


def write_layout(trainer: Trainer, breakdown: bool, use=None) -> None:
    """The run's page into its TensorBoard folder (rank 0), for its number of processes and what ``use`` (a
    callbacks.flops.DeviceUse) knows."""
    if trainer.is_global_zero:
        flops, peak = (bool(use.flops_per_image), bool(use.flops_per_image and use.peak)) if use else (False, False)
        summary = custom_scalars(layout(breakdown, trainer.world_size, flops, peak))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.file_writer.add_summary(summary)  # add_custom_scalars would open a second run
