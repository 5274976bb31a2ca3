"""``--strategy dp``: torch.nn.DataParallel in one process over several GPUs (Lightning 2.0 removed it).

Only the forward is parallel: ``self(x)`` scatters the batch over the GPUs and gathers the logits on the
first, so the loss, the metrics and ``self.log`` run once over the whole batch, and the module is not
wrapped (plain checkpoints). Why, and what stays DataParallel's own: docs/strategies.md, "dp".
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
from torch import nn

NO_GPU_MESSAGE = "strategy dp needs CUDA GPUs (none visible); use --strategy ddp --accelerator cpu on CPU"


class _Forward(nn.Module):
    """What DataParallel replicates: the LightningModule through its class's ``forward`` (the instance's routed
    ``forward`` would re-enter DataParallel from every replica), with the caller's autocast dtype set in the replicas'
    threads (autocast is thread-local: bf16-mixed would otherwise run float16 there)."""

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
            if not CUDAAccelerator.is_available():  # before Lightning's own "No supported gpu backend found!"
                raise MisconfigurationException(NO_GPU_MESSAGE)
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
            autocast = torch.is_autocast_enabled("cuda")  # thread-local: the replicas' threads need it set
            data_parallel.module.autocast_dtype = torch.get_autocast_dtype("cuda") if autocast else None
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

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision
