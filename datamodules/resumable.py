"""A training loader that resumes mid-epoch at the batch after the last one trained (Lightning restarts a plain
DataLoader at the epoch's first batch): its position is saved with every checkpoint and the sampler leaves out the
batches already trained; :func:`check_position` warns, once, whenever a resume cannot continue exactly.
The story: docs/reliability.md, "Exact resume"."""

import itertools
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, DistributedSampler

from datamodules.in_memory import already_batched


class DataPositionWarning(UserWarning):
    """The training data does not continue where the resumed loop counters say it should."""


class ResumableDistributedSampler(DistributedSampler):
    """A DistributedSampler that can start one epoch part-way through this rank's shard (same order, same length).

    ``resume_at(epoch, skip)``: the next iteration, if it is of ``epoch``, leaves out the first ``skip``
    indices; any iteration clears the request. ``started``: (epoch, indices left out) of the latest iteration.
    ``virtual`` > 1: this process stands for that many consecutive ranks (``num_replicas`` counts them all, ``rank``
    is the first): each step's indices are their batches of ``batch`` in rank order, as their own samplers give them."""

    def __init__(self, *args: Any, virtual: int = 1, batch: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume: Optional[Tuple[int, int]] = None
        self.started: Tuple[int, int] = (self.epoch, 0)
        self.virtual, self.batch = virtual, batch

    def __len__(self) -> int:
        return self.num_samples * self.virtual

    def _ordered(self) -> Iterator[int]:
        if self.virtual == 1:
            return super().__iter__()
        first, shards = self.rank, []
        for rank in range(first, first + self.virtual):
            self.rank = rank
            shards.append(list(super().__iter__()))  # DistributedSampler's order and padding for that rank
        self.rank = first
        return (i for start in range(0, self.num_samples, self.batch) for shard in shards
                for i in shard[start:start + self.batch])

    def resume_at(self, epoch: int, skip: int) -> None:
        self._resume = (epoch, skip)

    def __iter__(self) -> Iterator[int]:
        # Checked here, not when the request is made: without workers the DataLoader draws the indices lazily, at
        # its first batch, after Lightning's set_epoch; a request for an epoch that is not the one drawn is dropped.
        resume, self._resume = self._resume, None
        skip = resume[1] if resume is not None and resume[0] == self.epoch else 0
        self.started = (self.epoch, skip)
        return itertools.islice(self._ordered(), skip, None)


class ResumableLoader(DataLoader):
    """A DataLoader over a :class:`ResumableDistributedSampler` whose ``state_dict`` is its position; Lightning saves it
    with every checkpoint and, when it resumes, gives it back to ``load_state_dict`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Lightning re-creates the loader with a SequentialSampler for --trainer.overfit_batches: then it is a plain
        # DataLoader (the same batches every epoch; no position).
        self.resumable = isinstance(self.sampler, ResumableDistributedSampler)
        self.position: Tuple[int, int] = (getattr(self.sampler, "epoch", 0), 0)  # (epoch, batches of it handed out)
        self.resumed_at: Optional[Tuple[int, int]] = None  # the position loaded, until the next batch is checked
        self.warned = False

    def __iter__(self) -> Iterator:
        if not self.resumable:
            return super().__iter__()
        direct = self.num_workers == 0 and hasattr(self.dataset, "__getitems__") and self.collate_fn is already_batched
        return self._gathered() if direct else self._counted(super().__iter__())

    def _gathered(self) -> Iterator:
        """Without workers, the DataLoader's own iterator is host time on every step (a sampler index at a time, a
        list, its fetcher): the epoch's order becomes one index tensor here, and each batch is a slice of it and the
        dataset's one gather; the same batches, in the same order, as the DataLoader's iterator, which also draws its
        workers' base seed from the global generator: drawn here too, so dropout and augmentation draw as they did."""
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        if getattr(self.dataset, "device", order.device).type == "cuda":
            order = order.to(self.dataset.device)  # once an epoch: no index crosses the bus per step
        epoch, skipped = self.sampler.started
        size, gather = self.batch_size, self.dataset.__getitems__
        for count, start in enumerate(range(0, len(order), size), skipped // size + 1):
            if self.drop_last and start + size > len(order):
                return
            batch = gather(order[start:start + size])
            self.position = (epoch, count)
            yield [tensor.pin_memory() for tensor in batch] if self.pin_memory else batch

    def _counted(self, iterator: Iterator) -> Iterator:
        """The batches, the position updated as each leaves."""
        for count, batch in enumerate(iterator, 1):  # the sampler's iteration starts at the first: `started` after it
            epoch, skipped = self.sampler.started
            self.position = (epoch, skipped // self.batch_size + count)
            yield batch

    def state_dict(self) -> Dict[str, int]:
        if not self.resumable:
            return {}
        epoch, batches = self.position
        return {"epoch": epoch, "batches": batches, "batch_size": self.batch_size,
                "world_size": self.sampler.num_replicas}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if not self.resumable or not state:
            return
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if (state.get("batch_size"), state.get("world_size")) != (self.batch_size, self.sampler.num_replicas):
            self.warn_once(
                f"the checkpoint stopped after batch {batches} of epoch {epoch + 1} at batch size "
                f"{state.get('batch_size')} per process and {state.get('world_size')} process(es); this run has "
                f"{self.batch_size} and {self.sampler.num_replicas}: the rest of that epoch starts at batch "
                f"{batches + 1} of the new order, so some of its images are trained twice or not at all"
            )
        self.sampler.set_epoch(epoch)
        self.sampler.resume_at(epoch, batches * self.batch_size)
        self.position = self.resumed_at = (epoch, batches)

    def warn_once(self, message: str) -> None:
        if not self.warned:
            self.warned = True
            rank_zero_warn(message, category=DataPositionWarning)


def check_position(loader: object, epoch: int, batches_before: int, accumulate: int = 1) -> None:
    """Warns (once) when the batch just handed out is not batch ``batches_before + 1`` of ``epoch`` (0-based epoch),
    Lightning's count, or when a resumed epoch continues between two optimizer steps (``accumulate`` > 1: the
    gradients summed so far were not in the checkpoint). Silent for loaders that are not a :class:`ResumableLoader`."""
    if not isinstance(loader, ResumableLoader) or not loader.resumable:
        return
    resumed, loader.resumed_at = loader.resumed_at, None
    if loader.position != (epoch, batches_before + 1):
        got_epoch, got = loader.position
        loader.warn_once(
            f"the training data is out of step with the resumed loop: Lightning is at batch {batches_before + 1} of "
            f"epoch {epoch + 1}, the data loader handed out batch {got} of epoch {got_epoch + 1} (a mid-epoch "
            f"checkpoint without the loader's position?): this epoch's batches are shifted; resume from an "
            f"end-of-epoch checkpoint for an exact run"
        )
    elif resumed is not None and resumed[0] == epoch and resumed[1] % accumulate:
        done = resumed[1]
        first = done - done % accumulate + 1
        loader.warn_once(
            f"resumed after batch {done} of epoch {epoch + 1}, between two optimizer steps (accumulate_grad_batches "
            f"{accumulate}): the gradients of {_batches(first, done)} were not in the checkpoint, so the next "
            f"optimizer step sums those of {_batches(done + 1, first + accumulate - 1)} only; the data continues "
            f"at the right batch, the weights are no longer the uninterrupted run's"
        )


def _batches(first: int, last: int) -> str:
    return f"batch {first}" if first == last else f"batches {first}-{last}"
