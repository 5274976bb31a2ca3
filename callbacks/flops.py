"""Throughput against the hardware (docs/reporting.md, "Against the hardware"): the training FLOPs of one image,
counted once at setup by torch's FlopCounterMode (through Lightning's ``measure_flops``) on a meta-device copy of the
network, and one device's peak FLOP/s: Lightning's table for a GPU (``get_available_flops``), a matmul of the run's
dtype measured at start-up on a CPU, or the ``peak_flops`` key. Achieved FLOP/s and MFU are then images/sec ×
FLOPs per image (÷ the peak) at the points ThroughputReport logs anyway: nothing per step, no collective."""

import copy
import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from lightning.fabric.utilities.throughput import get_available_flops, measure_flops
from torch import nn

IMAGE = (1, 28, 28)  # the networks' contract (lightning_modules/classifier.py)
PROBE_S = 0.3  # the CPU probe's start-up time: no matmul is begun that the last one says would end after it
PROBE_SIZES = (128, 256, 512, 1024, 2048)  # square matmuls, doubling; the best of 3 calls at each


def si(value: float, unit: str) -> str:
    """``1.117e8, "FLOP"`` -> ``111.7 MFLOP``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def peak_refusal(value) -> Optional[str]:
    """Why ``value`` cannot be one device's peak FLOP/s (None: it can, or it is None and is looked up)."""
    if value is None or (isinstance(value, (int, float)) and 0 < value < math.inf):
        return None
    return (f"peak_flops (--peak_flops) is {value!r}: give one device's peak FLOP/s, a finite number > 0 (e.g. "
            f"9.89e14), or null to look it up (Lightning's table for a GPU, a matmul measured at start-up on a CPU)")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def compute_dtype(precision) -> torch.dtype:
    """The dtype the run's matmuls and convolutions compute in, from the Trainer's precision (``32-true``,
    ``bf16-mixed``, ``16-mixed``, ``64-true``...)."""
    text = str(precision)
    return (torch.bfloat16 if text.startswith("bf16") else torch.float16 if text.startswith("16")
            else torch.float64 if text.startswith("64") else torch.float32)


def training_flops(network: nn.Module, batch: int = 2) -> float:
    """FLOPs of one image's forward and backward through ``network``: FlopCounterMode's count (matrix products and
    convolutions; not batch-norm, activations, pooling or the optimizer) over a batch of ``batch`` images on a
    meta-device copy (shapes only: no values, no memory, the network itself untouched), divided by ``batch``."""
    meta = copy.deepcopy(network).to("meta")
    images = torch.zeros(batch, *IMAGE, device="meta")
    return measure_flops(meta, lambda: meta(images), lambda logits: logits.sum()) / batch


def cpu_peak(dtype: torch.dtype, budget_s: float = PROBE_S,
             clock: Callable[[], float] = time.perf_counter) -> Tuple[float, float]:
    """The best FLOP/s of square matmuls of ``dtype`` on this process's threads, and the seconds the probe took. A
    call is begun only if the one before it (8× less work at the size before) says it ends within ``budget_s``."""
    start, best, took = clock(), 0.0, 0.0
    for n in PROBE_SIZES:
        matrix = torch.ones(n, n, dtype=dtype)
        for _ in range(3):  # the first call at 128 also starts the thread pool
            if clock() - start + took > budget_s:
                return best, clock() - start
            began = clock()
            torch.mm(matrix, matrix)
            took = clock() - began
            best = max(best, 2 * n ** 3 / took) if took > 0 else best
        took *= 8
    return best, clock() - start


def device_peak(device: torch.device, dtype: torch.dtype, given: Optional[float]) -> Tuple[Optional[float], str]:
    """One device's peak FLOP/s and where it comes from, in the start block's words (the reason when unknown)."""
    if given is not None:
        return given, "from the peak_flops key"
    if device.type == "cpu":
        peak, seconds = cpu_peak(dtype)
        probe = f"a {dtype_name(dtype)} matmul on {torch.get_num_threads()} thread(s)"
        if peak <= 0:
            return None, f"the CPU probe ({probe}) timed nothing in {seconds:.2f} s"
        return peak, f"{probe}, measured at start-up in {seconds:.2f} s"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peak = get_available_flops(device, dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    if not peak:
        said = "; ".join(str(w.message) for w in caught) or f"no figure for {name}"
        return None, f"Lightning's table has none for {name} in {dtype_name(dtype)} ({said})"
    return float(peak), f"Lightning's table for {name} in {dtype_name(dtype)}"


@dataclass(frozen=True)
class DeviceUse:
    """A run's training FLOPs per image and one device's peak (None: not counted, not known), the start block's
    lines that say so, and the figures of a throughput window or an epoch from its images/sec per device."""

    LABELS = ("  training FLOPs  :", "  peak FLOP/s     :")  # the start block's lines begin so

    flops_per_image: Optional[float] = None
    peak: Optional[float] = None
    peak_from: str = ""
    lines: Tuple[str, ...] = ()

    def figures(self, images_per_sec_per_device: float, prefix: str) -> Dict[str, float]:
        """``<prefix>flops_per_sec_per_device`` and, where the peak is known, ``<prefix>mfu`` (a fraction)."""
        if not self.flops_per_image:
            return {}
        achieved = images_per_sec_per_device * self.flops_per_image
        return {f"{prefix}flops_per_sec_per_device": achieved, **({f"{prefix}mfu": achieved / self.peak}
                                                                 if self.peak else {})}

    def params(self) -> Dict[str, object]:
        """The run record's entries (hparams.yaml, TensorBoard's HPARAMS tab)."""
        return {"train_flops_per_image": self.flops_per_image, "peak_flops": self.peak,
                "peak_flops_from": self.peak_from or None}

    @staticmethod
    def measure(network: nn.Module, batch: int, device: torch.device, precision,
                given_peak: Optional[float] = None) -> "DeviceUse":
        """Counted and looked up once, at setup; a network the counter cannot run gives a line and no figures."""
        name = f"{type(network).__module__}.{type(network).__qualname__}"
        began = time.perf_counter()
        try:
            flops = training_flops(network, batch)
        except Exception as error:  # whatever the user's forward does that shapes alone cannot: a line, no figures
            detail = " ".join(f"{type(error).__name__}: {error}".split())[:200]
            return DeviceUse(lines=(f"{DeviceUse.LABELS[0]} not counted: FlopCounterMode cannot run {name} on the meta "
                                    f"device ({detail}); no FLOP/s or MFU figures",))
        if not flops:
            return DeviceUse(lines=(f"{DeviceUse.LABELS[0]} none counted in {name} (FlopCounterMode counts matrix "
                                    "products and convolutions); no FLOP/s or MFU figures",))
        counted = (f"{DeviceUse.LABELS[0]} {si(flops, 'FLOP')} an image, forward and backward (FlopCounterMode on the "
                   f"meta device, {time.perf_counter() - began:.2f} s)")
        peak, source = device_peak(device, compute_dtype(precision), given_peak)
        known = (f"{DeviceUse.LABELS[1]} {si(peak, 'FLOP/s')} per device, {source}" if peak else
                 f"{DeviceUse.LABELS[1]} unknown: {source}; no MFU (give --peak_flops, FLOP/s per device)")
        return DeviceUse(flops, peak, source, (counted, known))
