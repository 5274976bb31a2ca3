"""``--strategy dp``: torch.nn.DataParallel in one process over several GPUs; only the forward is parallel, the module
stays unwrapped (plain checkpoints). Why, and what stays DataParallel's own: docs/strategies.md, "dp"."""

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
from torch import nn

NO_GPU_MESSAGE = "strategy dp needs CUDA GPUs (none visible); use --strategy ddp --accelerator cpu on CPU"


def require_gpus() -> None:
    """Before Lightning's own "No supported gpu backend found!" (the CLI calls it before the Trainer's srun warning)."""
    if not CUDAAccelerator.is_available():
        raise MisconfigurationException(NO_GPU_MESSAGE)


class _Forward(nn.Module):
    """The module through its class's ``forward`` (the routed one would re-enter DataParallel), under the caller's
    autocast dtype (thread-local: the replicas' threads need it set)."""

    def __init__(self, module: LightningModule) -> None:
        super().__init__()
        self.module = module
        self.autocast_dtype: Optional[torch.dtype] = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cuda", dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            return type(self.module).forward(self.module, *args, **kwargs)


class DataParallelStrategy(ParallelStrategy):
    """One process; the forward runs under ``nn.DataParallel`` over ``parallel_devices`` (``--devices 0,2``: GPUs 0
    and 2, gathered on cuda:0)."""

    strategy_name = "dp"

    def __init__(self, accelerator: Optional["pl.accelerators.Accelerator"] = None,
                 parallel_devices: Optional[List[torch.device]] = None, checkpoint_io: Optional[CheckpointIO] = None,
                 precision_plugin: Optional[Precision] = None) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices, cluster_environment=None,
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self.num_nodes = 1  # the accelerator connector sets the --num_nodes value; _configure_launcher checks it
        self._data_parallel: Optional[nn.DataParallel] = None
        self._routed: Optional[tuple] = None  # (module, the forward installed on it)

    # One process, several devices (Lightning gives the strategy its cluster environment: SLURM's ranks under srun).
    global_rank = local_rank = node_rank = property(lambda self: 0)
    world_size = property(lambda self: 1)

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices, "parallel_devices are set by the accelerator connector"
        return self.parallel_devices[0]

    @property
    def device_ids(self) -> List[int]:
        """CUDA indices of ``parallel_devices``, e.g. ``[0, 2]`` for ``--devices 0,2`` (read at setup: they are set)."""
        return [device.index for device in self.parallel_devices]

    @property
    def devices_per_process(self) -> int:
        """GPUs this one process drives: the datamodule's loader yields that many per-device batches at once."""
        return len(self.parallel_devices) if self.parallel_devices else 1

    def _configure_launcher(self) -> None:
        """No launcher: one process. Called at the end of ``Trainer.__init__``, so a bad setup fails there."""
        self._require_cuda_devices()
        if self.num_nodes != 1:
            raise MisconfigurationException(f"strategy dp runs in one process on one machine (num_nodes="
                                            f"{self.num_nodes}); use --strategy ddp for several nodes")

    def _require_cuda_devices(self) -> None:
        devices = self.parallel_devices or []
        if not isinstance(self.accelerator, CUDAAccelerator) or any(device.type != "cuda" for device in devices):
            require_gpus()
            accelerator = type(self.accelerator).__name__.replace("Accelerator", "").lower()
            raise MisconfigurationException(f"strategy dp runs on CUDA GPUs, not on accelerator {accelerator}; drop "
                                            "--accelerator, or use --strategy ddp --accelerator cpu on CPU")

    def model_to_device(self) -> None:
        self.model.to(self.root_device)  # DataParallel needs the parameters on device_ids[0]

    def _setup_model(self, model: nn.Module) -> nn.Module:
        """Leave the module unwrapped (plain checkpoints); route its forward through DataParallel."""
        assert isinstance(model, LightningModule), "dp expects the LightningModule itself"
        self._restore_forward()
        data_parallel = nn.DataParallel(_Forward(model), device_ids=self.device_ids, output_device=self.root_device)

        def forward(*args: Any, **kwargs: Any) -> Any:
            autocast = torch.is_autocast_enabled("cuda")  # thread-local: the replicas' threads need it set
            data_parallel.module.autocast_dtype = torch.get_autocast_dtype("cuda") if autocast else None
            return data_parallel(*args, **kwargs)

        # A plain function in the instance __dict__ (not a registered submodule: state_dict keys stay the same).
        # nn.Module.__call__ looks up self.forward, and the instance attribute wins over the class's method.
        model.forward = forward
        self._data_parallel = data_parallel
        self._routed = (model, forward)
        return model

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

    def reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision
