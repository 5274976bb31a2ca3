"""``--strategy dp``: torch.nn.DataParallel in one process over several GPUs.

Lightning 2.0 removed DataParallel; this brings it back, with one change of design.

Lightning 1.x wrapped the whole LightningModule in ``nn.DataParallel`` and ran
``training_step`` on every replica, each in its own thread, then reduced the
vector of per-GPU losses. Everything else a step does ran in the replicas too:
metric updates went to throw-away copies of the metric (lost), ``self.log``
calls raced between threads, and the loss vector was averaged without regard to
the size of each GPU's chunk (wrong for an uneven last batch).

Here the parallelism sits at the forward instead. ``setup`` routes the
LightningModule's ``forward`` through
``nn.DataParallel(_Forward(module), device_ids, output_device=root)``: ``self(x)``
inside ``training_step``/``validation_step``/``test_step``/``predict_step`` scatters
``x`` over the GPUs, each runs the network on its chunk, and the logits are
gathered on the root GPU. The step itself runs once, in the main thread, over
the whole batch: the loss is one mean over all images (equal to the per-GPU
losses reduced by a chunk-size-weighted mean, see tests/test_dp.py), metrics
see every image exactly once, ``self.log`` is called once. ``teardown`` removes
the route again. What stays DataParallel's own: in training, BatchNorm normalises
each GPU's chunk with that chunk's statistics (as ddp does without
``sync_batchnorm``), and its running statistics come from the first GPU's chunk.

The module itself is not wrapped (``strategy.model`` stays the LightningModule),
so checkpoints hold its plain ``state_dict``: a ``dp`` checkpoint loads in a
single-device run and vice versa.

One process: world size 1, rank 0; reduce, all_gather, barrier and broadcast are
the identity. The loader yields ``batch_size x GPUs`` images per step
(``devices_per_process``, read by the datamodule), so each GPU still sees
``batch_size``. Without CUDA GPUs, building the Trainer fails with one line.
"""

from typing import Any, List, Optional

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningModule
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.strategies.strategy import TBroadcast
from torch import Tensor, nn

NO_GPU_MESSAGE = "strategy dp needs CUDA GPUs (none visible); use --strategy ddp --accelerator cpu on CPU"


def require_cuda_for_dp() -> None:
    """The one-line error for dp on a machine without CUDA GPUs, before Lightning's own.

    ``--accelerator gpu`` (as in configs/strategy/dp.yaml) fails inside Lightning's
    accelerator choice, before any strategy exists, with "No supported gpu backend
    found!"; train.py calls this first so the user reads what to do instead.
    """
    if not CUDAAccelerator.is_available():
        raise MisconfigurationException(NO_GPU_MESSAGE)


def _cuda_autocast_dtype() -> Optional[torch.dtype]:
    """The calling thread's CUDA autocast dtype, None when autocast is off (torch 2.2 to today)."""
    if not torch.is_autocast_enabled():  # no argument: CUDA's autocast, in every torch version
        return None
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.get_autocast_dtype("cuda")
    return torch.get_autocast_gpu_dtype()


class _Forward(nn.Module):
    """What DataParallel replicates: the LightningModule, called through its class's own ``forward``.

    DataParallel's replicas are shallow copies of the module's ``__dict__``, which
    holds the routed ``forward``; ``module(x)`` or ``module.forward(x)`` would
    re-enter DataParallel from every replica. ``type(module).forward`` does not.

    ``autocast_dtype`` is set in the calling thread before each call: DataParallel
    runs the replicas in worker threads and re-enables autocast there with the
    default dtype (float16), since the autocast dtype is thread-local; without
    this a ``bf16-mixed`` run would compute its forward in float16 on the GPUs.
    """

    def __init__(self, module: LightningModule) -> None:
        super().__init__()
        self.module = module
        self.autocast_dtype: Optional[torch.dtype] = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        if self.autocast_dtype is None:
            return type(module).forward(module, *args, **kwargs)
        with torch.autocast("cuda", dtype=self.autocast_dtype):
            return type(module).forward(module, *args, **kwargs)


class DataParallelStrategy(ParallelStrategy):
    """One process; the LightningModule's forward runs under ``nn.DataParallel`` over ``parallel_devices``.

    ``--devices 0,2`` reaches this strategy as ``parallel_devices=[cuda:0, cuda:2]``:
    DataParallel then uses GPUs 0 and 2, gathering on cuda:0.
    """

    strategy_name = "dp"

    def __init__(
        self,
        accelerator: Optional["pl.accelerators.Accelerator"] = None,
        parallel_devices: Optional[List[torch.device]] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=None,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.num_nodes = 1  # the accelerator connector sets the --num_nodes value; _configure_launcher checks it
        self._data_parallel: Optional[nn.DataParallel] = None
        self._routed: Optional[tuple] = None  # (module, the forward installed on it)

    # ------------------------------------------------------------------ one process, several devices

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_distributed(self) -> bool:
        """One process: Lightning must not swap in a DistributedSampler of its own."""
        return False

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices, "parallel_devices are set by the accelerator connector"
        return self.parallel_devices[0]

    @property
    def device_ids(self) -> List[int]:
        """CUDA indices of ``parallel_devices``, e.g. ``[0, 2]`` for ``--devices 0,2``."""
        assert self.parallel_devices, "parallel_devices are set by the accelerator connector"
        return [device.index for device in self.parallel_devices]

    @property
    def devices_per_process(self) -> int:
        """GPUs this one process drives: the datamodule's loader yields that many per-device batches at once."""
        return len(self.parallel_devices) if self.parallel_devices else 1

    def _configure_launcher(self) -> None:
        """No launcher: one process. Called at the end of ``Trainer.__init__``, so a bad setup fails there."""
        self._require_cuda_devices()
        if self.num_nodes != 1:
            raise MisconfigurationException(
                f"strategy dp runs in one process on one machine (num_nodes={self.num_nodes}); "
                "use --strategy ddp for several nodes"
            )

    def _require_cuda_devices(self) -> None:
        if not isinstance(self.accelerator, CUDAAccelerator) or any(
            device.type != "cuda" for device in self.parallel_devices or []
        ):
            require_cuda_for_dp()
            accelerator = type(self.accelerator).__name__.replace("Accelerator", "").lower()
            raise MisconfigurationException(
                f"strategy dp runs on CUDA GPUs, not on accelerator {accelerator}; "
                "drop --accelerator, or use --strategy ddp --accelerator cpu on CPU"
            )

    # ------------------------------------------------------------------ the forward route

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)  # DataParallel needs the parameters on device_ids[0]

    def _setup_model(self, model: nn.Module) -> nn.Module:
        """Leave the module unwrapped (plain checkpoints); route its forward through DataParallel."""
        assert isinstance(model, LightningModule), "dp expects the LightningModule itself"
        self._route_forward(model)
        return model

    def _route_forward(self, module: LightningModule) -> None:
        self._restore_forward()
        data_parallel = nn.DataParallel(_Forward(module), device_ids=self.device_ids, output_device=self.root_device)

        def forward(*args: Any, **kwargs: Any) -> Any:
            data_parallel.module.autocast_dtype = _cuda_autocast_dtype()
            return data_parallel(*args, **kwargs)

        # A plain function in the instance __dict__ (not a registered submodule: state_dict keys stay the same).
        # nn.Module.__call__ looks up self.forward, and the instance attribute wins over the class's method.
        module.forward = forward
        self._data_parallel = data_parallel
        self._routed = (module, forward)

    def _restore_forward(self) -> None:
        if self._routed is not None:
            module, forward = self._routed
            if module.__dict__.get("forward") is forward:
                del module.__dict__["forward"]
        self._data_parallel = None
        self._routed = None

    def teardown(self) -> None:
        self._restore_forward()
        super().teardown()

    # ------------------------------------------------------------------ collectives of one process

    def reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        """One process: the step already saw the whole batch, so there is nothing to reduce."""
        return tensor

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        return tensor

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision
