"""Fashion-MNIST as a LightningDataModule: splits held in memory (on the GPU when training there), distributed
sampling, and uint8 batches normalised and augmented on the device."""

from typing import Any, Dict, Optional, Tuple

import torch
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader
from torchvision.datasets import FashionMNIST

from datamodules.augment import augmentation_seed, random_crop, random_horizontal_flip, run_seed
from datamodules.files import (SPLITS, check_raw_folder, default_data_dir, download_or_raise, missing_files,
                               raw_folder, read_header, torchvision_root)
from datamodules.in_memory import Batch, InMemoryImages, already_batched, stratified_holdout
from datamodules.resumable import ResumableDistributedSampler, ResumableLoader, check_position
from datamodules.workers import check_workers, imported

# Mean and standard deviation of the 60,000 training images' pixels, scaled to [0, 1].
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530

_SHIFT = torch.tensor(-PIXEL_MEAN / PIXEL_STD)  # a 0-d CPU tensor: it serves a batch on any device as a scalar


def normalise(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to the float inputs every network sees: scaled to [0, 1], then zero mean and unit variance over
    the training set. One op (shift + pixels × scale, float32 by type promotion): a step's host time is a budget."""
    return torch.add(_SHIFT, images, alpha=1.0 / (255.0 * PIXEL_STD))


class FashionMNISTDataModule(LightningDataModule):
    """Fashion-MNIST: 60,000 training images, validation and test on the 10,000-image test split.

    Args:
        data_dir: Folder holding ``FashionMNIST/raw`` (torchvision's layout). Default:
            ``$FASHION_MNIST_DIR``, else ``./data``.
        batch_size: Images per device per step. The effective batch is this × devices × nodes × accumulate_grad_batches.
        eval_batch_size: Images per device per validation/test step (does not change results).
        num_workers: DataLoader worker processes. 0 is fastest here: a batch is one tensor gather.
        worker_timeout: With workers, seconds a rank waits for a batch (DataLoader's ``timeout``), then stops with
            one line saying a data worker stalled (exit 75). ``None``: train.py uses half its ``collective_timeout``
            (so the stalled rank reports before its peers time out), elsewhere DataLoader's default (forever).
        worker_init_fn: With workers, the import path of DataLoader's ``worker_init_fn`` (a name, so that
            hyperparameters and checkpoints hold no code; configs/default.yaml's: the workers die with their rank).
        download: Download the files when missing (needs network). Nodes that download into one shared folder at
            once each publish checked files; none replaces another's, no reader sees a half-written file.
        mirror: URL of a folder holding torchvision's four ``.gz`` files (the same MD5s), tried before its own
            mirrors.
        random_crop_padding: Training augmentation: shift each image by up to this many pixels
            (zero padding, as torchvision's ``RandomCrop(28, padding)``). 0: off.
        horizontal_flip: Training augmentation: mirror each image with probability 0.5.
        keep_on_device: When training on a GPU with ``num_workers`` 0, hold both splits in GPU memory
            (47 + 8 MB) and gather batches there. Ignored on CPU. False: batches are gathered in host memory
            and copied from pinned memory.
        train_subset: Train on the first N training images only (the file's order after ``val_size`` is held out,
            the same for every seed and world size; the first 10,000 hold 942 to 1,027 images of each class);
            ``None``: all of them. For short experiments; validation is unchanged.
        virtual_devices: One process stands for this many devices at ``batch_size`` each (docs/large_batch.md): its
            loader serves their shards side by side, in rank order, as their own samplers would; the model gets the
            count through the CLI's link (its batch-norm and LR rule follow it). 1: off.
        val_size: Hold out this many training images (stratified by class, the same for every seed and world size)
            and validate on them; 0: validate on the 10,000-image test split, as the DLI workshop does (then nothing
            may be selected on validation: the test after fit evaluates the last epoch, not the best).
        val_seed: Which images ``val_size`` holds out (the draw's seed): to judge a small difference, give each run
            seed its own set, not one set for all (docs/benchmarks.md, "One held-out set is not enough")."""

    def __init__(
        self,
        data_dir: Optional[str] = None,
        batch_size: PositiveInt = 128,
        eval_batch_size: PositiveInt = 1000,
        num_workers: NonNegativeInt = 0,
        worker_timeout: Optional[PositiveFloat] = None,
        worker_init_fn: Optional[str] = None,
        download: bool = True,
        mirror: Optional[str] = None,
        random_crop_padding: NonNegativeInt = 0,
        horizontal_flip: bool = False,
        keep_on_device: bool = True,
        train_subset: Optional[PositiveInt] = None,
        virtual_devices: PositiveInt = 1,
        val_size: NonNegativeInt = 0,
        val_seed: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.data_dir = data_dir or default_data_dir()
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.worker_timeout, self.worker_init_fn = worker_timeout, worker_init_fn
        self._worker_init = imported(worker_init_fn, "worker_init_fn") if worker_init_fn else None
        self.download, self.mirror = download, mirror
        self.random_crop_padding = random_crop_padding
        self.horizontal_flip = horizontal_flip
        self.keep_on_device = keep_on_device
        self.train_subset, self.virtual_devices = train_subset, virtual_devices
        self.val_size, self.val_seed = val_size, val_seed
        self.train_set: Optional[InMemoryImages] = None
        self.val_set: Optional[InMemoryImages] = None  # the held-out images; None: validation is the test split
        self._train_loader: Optional[ResumableLoader] = None
        self._resume_position: Optional[Dict[str, int]] = None  # from a checkpoint, for the next train loader
        self._position_checked: Optional[int] = None  # the epoch whose first batch check_position saw
        self.test_set: Optional[InMemoryImages] = None

    def prepare_data(self) -> None:
        """Once per node (local rank 0), before any worker starts: download missing files when allowed, then check
        all four (datamodules/files.py)."""
        missing, folder = missing_files(self.data_dir), raw_folder(self.data_dir)
        if missing:
            download_or_raise(self.data_dir, missing, self.download, self.mirror)
        check_raw_folder(folder.resolve())
        if self.val_seed and not self.val_size:
            raise MisconfigurationException(f"--data.val_seed {self.val_seed} chooses the images --data.val_size "
                                            "holds out, and that is 0: give --data.val_size N too, or leave it at 0")
        left = read_header(folder / SPLITS[0][0], 3)[0] - self.val_size
        self._check_train_subset(left)
        self._check_batch_fits(self.train_subset or left)

    def check_workers(self) -> None:
        """The workers' temp folder and ``worker_init_fn`` (datamodules/workers.py): call it in every process, before
        anything is written; a rank that skipped it would wait for its peers at the rendezvous."""
        check_workers(self.num_workers, self._worker_init, self.worker_init_fn, self.worker_timeout)

    def _check_batch_fits(self, images: int) -> None:
        """A per-device batch larger than a device's shard of the training images never fills (and, at 70,000, the
        whole split is gathered into one batch until memory runs out): refused before anything starts."""
        world_size, _ = self._world()
        devices = world_size * self.virtual_devices * self._process_batch(1)
        shard = -(-images // devices)  # DistributedSampler's: padded to a whole share each
        if self.batch_size > shard:
            kept = "after --data.val_size and --data.train_subset " if self.val_size or self.train_subset else ""
            raise MisconfigurationException(
                f"--data.batch_size {self.batch_size} per device is more than the {shard} training images each of the "
                f"{devices} device(s) gets ({images} images {kept}over {devices}): give at most {shard}")

    def _check_train_subset(self, left: int) -> None:
        """More than ``left`` would silently train on all of them: refused before anything is written."""
        if self.train_subset is not None and self.train_subset > left:
            held = f" after --data.val_size {self.val_size} held out" if self.val_size else ""
            raise MisconfigurationException(f"--data.train_subset {self.train_subset} is more than the {left} training "
                                            f"images{held}: give at most {left}, or leave it unset to train on all")

    def setup(self, stage: str) -> None:
        """Every rank checks the files again (headers and labels: a few KB) and reads them into memory (47 MB)."""
        if self.train_set is None or self.test_set is None:
            missing = missing_files(self.data_dir)
            if missing:  # prepare_data ran on another node's file system, or not at all (e.g. validate without fit)
                download_or_raise(self.data_dir, missing, allowed=False)
            check_raw_folder(raw_folder(self.data_dir).resolve())
        root = str(torchvision_root(self.data_dir))
        if stage in ("fit", "validate") and self.train_set is None:
            train = FashionMNIST(root, train=True, download=False)
            kept, held_out = stratified_holdout(train.targets, self.val_size, self.val_seed)
            if self.val_size:
                self.val_set = InMemoryImages(train.data[held_out], train.targets[held_out])
            self._check_train_subset(len(kept))
            kept = kept[: self.train_subset]  # the first n images left
            self.train_set = InMemoryImages(train.data[kept], train.targets[kept])
        if self.test_set is None:
            test = FashionMNIST(root, train=False, download=False)
            self.test_set = InMemoryImages(test.data, test.targets)
        device = self._resident_device()
        for split in (self.train_set, self.val_set, self.test_set):
            if split is not None and split.device != device:
                split.to(device)

    def _resident_device(self) -> torch.device:
        """Where the splits live: the GPU this process trains on (with ``keep_on_device``), else host memory (also when
        DataLoader workers are asked for: a worker process cannot gather from CUDA memory)."""
        trainer = self.trainer
        on_gpu = trainer is not None and trainer.strategy.root_device.type == "cuda"
        if self.keep_on_device and on_gpu and self.num_workers == 0:
            return trainer.strategy.root_device
        return torch.device("cpu")

    def _loader(self, dataset: InMemoryImages, batch_size: int, sampler=None, loader_class=DataLoader,
                **options) -> DataLoader:
        workers = dict(timeout=self.worker_timeout or 0, worker_init_fn=self._worker_init) if self.num_workers else {}
        return loader_class(
            dataset,
            **options,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=already_batched,
            persistent_workers=self.num_workers > 0,
            # Pinned host memory makes the copy to the GPU asynchronous; a split already on the GPU needs no copy.
            pin_memory=torch.cuda.is_available() and dataset.device.type == "cpu",
            **workers,
        )

    def _world(self) -> Tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _process_batch(self, per_device: int) -> int:
        """Images per loader batch in this process for ``per_device`` images per device: ``dp`` drives several GPUs
        from one process (the strategy says how many)."""
        trainer = self.trainer
        return per_device * getattr(trainer.strategy, "devices_per_process", 1) if trainer is not None else per_device

    def train_dataloader(self) -> DataLoader:
        """Disjoint shards of one DistributedSampler order for every world size (also 1), reshuffled each epoch: step i
        of N ranks at batch B trains on the images of step i of one process at N×B. The loader's position is
        checkpointed."""
        world_size, rank = self._world()
        virtual = self.virtual_devices
        sampler = ResumableDistributedSampler(self.train_set, num_replicas=world_size * virtual, rank=rank * virtual,
                                              shuffle=True, seed=run_seed(), virtual=virtual, batch=self.batch_size)
        loader = self._loader(self.train_set, self._process_batch(self.batch_size) * virtual, sampler=sampler,
                              loader_class=ResumableLoader)
        if self._resume_position is not None:
            loader.load_state_dict(self._resume_position)
            self._resume_position = None
        self._train_loader, self._position_checked = loader, None
        return loader

    def _fitted_train_loader(self) -> Optional[ResumableLoader]:
        """The training loader Lightning iterates (ours, or Lightning's copy of it), when it keeps a position."""
        loader = getattr(self.trainer, "train_dataloader", None) if self.trainer is not None else None
        loader = self._train_loader if loader is None else loader
        return loader if isinstance(loader, ResumableLoader) and loader.resumable else None

    def state_dict(self) -> Dict[str, Any]:
        """The training loader's position, saved with every checkpoint: Lightning gives its own copy back only to a
        loader it creates after restoring, and ``estimated_stepping_batches`` creates ours before."""
        loader = self._fitted_train_loader()
        return {"train_position": loader.state_dict()} if loader is not None else {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        position, loader = state_dict.get("train_position"), self._fitted_train_loader()
        self._position_checked = None
        if position is not None and loader is not None:
            loader.load_state_dict(position)
        else:
            self._resume_position = position

    def _eval_loader(self, split: InMemoryImages) -> DataLoader:
        """Each image is evaluated exactly once, whatever the world size (no padded duplicates). Its own generator: a
        DataLoader draws its workers' base seed from torch's global generator at every pass, which training's dropout
        draws from too, so how often a run validates would change how it trains."""
        sampler = None
        world_size, rank = self._world()
        if world_size > 1:
            sampler = UnrepeatedDistributedSampler(split, num_replicas=world_size, rank=rank, shuffle=False)
        return self._loader(split, self._process_batch(self.eval_batch_size), sampler=sampler,
                            generator=torch.Generator())

    @property
    def validates_on_test_split(self) -> bool:
        """Whether validation reports on the test images (``val_size`` 0): then nothing may be selected by it."""
        return not self.val_size

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set if self.validates_on_test_split else self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def on_after_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        """Augment (training only) and normalise on the device, after the (4× smaller) uint8 batch is there; then the
        precision plugin's input conversion, which Lightning applied before the transfer, when it was still uint8."""
        trainer = self.trainer
        if not isinstance(batch, (tuple, list)):  # the model summary's example input (already normalised)
            return batch if trainer is None else trainer.precision_plugin.convert_input(batch)
        images, targets = batch
        if trainer is not None and trainer.training:
            epoch = trainer.current_epoch
            # Where a loader can start out of step with Lightning's counters: its first batch of each epoch (both count
            # one a batch after it); not every batch, whose host time is a budget.
            loader = self._fitted_train_loader() if epoch != self._position_checked else None
            if loader is not None:  # the batch came from it: is it the one Lightning's counters expect?
                self._position_checked = epoch
                check_position(loader, epoch, trainer.fit_loop.epoch_loop.batch_progress.current.ready,
                               trainer.accumulate_grad_batches)
            if self.random_crop_padding or self.horizontal_flip:
                images = self.augment(images, trainer)
        images = normalise(images)
        if trainer is not None:  # Lightning converted the uint8 batch before this (a no-op): the float one now
            images = trainer.precision_plugin.convert_input(images)  # 64-true: double, bf16-true: bfloat16
        return images, targets

    def augment(self, images: torch.Tensor, trainer) -> torch.Tensor:
        """Random crop and flip of one training batch, drawn from a generator seeded by (seed, rank, epoch, batch)."""
        batch_index = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        seed = augmentation_seed(run_seed(), trainer.global_rank, trainer.current_epoch, batch_index)
        generator = torch.Generator(device=images.device).manual_seed(seed)
        if self.random_crop_padding:
            images = random_crop(images, self.random_crop_padding, generator)
        if self.horizontal_flip:
            images = random_horizontal_flip(images, generator)
        return images
