"""``python -m tests.host_reads OUT.json TRAIN.PY-ARGS...``: train.py, counting every read of a tensor's values on the
host (``.item()``, ``.tolist()``, ``float()``/``int()``/``bool()``/``__index__`` of a tensor, ``.cpu()``,
``.numpy()`` and ``.to("cpu")``) over the whole process, and per training batch
(``--trainer.callbacks+=tests.host_reads.PerBatch``).

On the GPU each such read makes the host wait for the device. ``.cpu()`` and ``.numpy()`` of a tensor already in
host memory return it unchanged (no read, no wait): counted apart, as ``host_noop``.
"""

import json
import sys
from collections import Counter

import torch
from lightning.pytorch import Callback

from callbacks.owner import each

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy", "to")
counts: Counter = Counter()
noops: Counter = Counter()  # host_noop split by call (cpu, numpy, to)


def _to_host(args, kwargs) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names the host as its destination (``"cpu"``, a cpu device, a cpu
    tensor to match); a dtype alone stays where it is."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    if isinstance(target, (str, torch.device)):
        try:
            return torch.device(target).type == "cpu"
        except RuntimeError:
            return False
    return False


def _counting(name: str):
    original = getattr(torch.Tensor, name)
    if name == "to":
        def moved(self, *args, **kwargs):
            if _to_host(args, kwargs):
                counts["host_noop" if self.device.type == "cpu" else "to_cpu"] += 1
                noops["to"] += self.device.type == "cpu"
            return original(self, *args, **kwargs)
        return moved

    def counted(self, *args, **kwargs):
        noop = name in ("cpu", "numpy") and self.device.type == "cpu"
        counts["host_noop" if noop else name] += 1
        noops[name] += noop
        return original(self, *args, **kwargs)

    return counted


class PerBatch(Callback):
    """Reads from one training batch's start to the next one's, with the step and whether a decision fell in it."""

    batches: list = []

    def __init__(self) -> None:
        self._mark = None

    def _reads(self) -> int:
        return sum(v for k, v in counts.items() if k != "host_noop")

    def _agreement(self, trainer):
        return next(c for c in each(trainer.callbacks) if type(c).__name__ == "Agreement")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._mark is not None:
            step, reads, decisions, epoch = self._mark
            PerBatch.batches.append({"step": step, "epoch": epoch, "reads": self._reads() - reads,
                                     "decided": self._agreement(trainer).decisions != decisions
                                     or trainer.current_epoch != epoch})
        self._mark = (trainer.global_step, self._reads(), self._agreement(trainer).decisions, trainer.current_epoch)


def main() -> int:
    from fashion_mnist_dp.cli.app import main as train_main
    from tests import (
        host_reads,  # the module the callback is imported from (this one runs as __main__)
    )

    out, args = sys.argv[1], sys.argv[2:]
    for name in READS:
        setattr(torch.Tensor, name, host_reads._counting(name))
    code = train_main(args)
    with open(out, "w") as f:
        json.dump({"exit": int(code), "counts": host_reads.counts, "noops": host_reads.noops, "batches": host_reads.PerBatch.batches}, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
