"""On a GPU the steady-state training step never makes the host wait for the device: ~100 steps between decision
and log steps run under ``torch.cuda.set_sync_debug_mode("error")``, the step-time breakdown's CUDA events and (under
ddp) its timed comm hook included (skipped without CUDA)."""

import pytest
import torch
from lightning.pytorch import Callback

from callbacks import ThroughputReport
from fashion_mnist_dp import runtime
from tests.unit.conftest import tiny_fit, with_safety

EVERY = 200  # decision and log interval: no decision or log step inside the checked window


class SyncFreeWindow(Callback):
    """Last callback of the trainer: from the end of one steady-state step to the end of the next, any operation that
    synchronises with the GPU raises."""

    def __init__(self) -> None:
        self.checked = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        checking = torch.cuda.get_sync_debug_mode() != 0
        torch.cuda.set_sync_debug_mode(0)
        self.checked += int(checking)
        last_of_epoch = batch_idx + 2 >= trainer.num_training_batches
        if batch_idx >= 1 and not last_of_epoch and (trainer.global_step + 1) % EVERY:
            torch.cuda.set_sync_debug_mode("error")

    def on_exception(self, trainer, pl_module, exception):
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("precision,strategy", [("32-true", "auto"), ("bf16-mixed", "auto"), ("32-true", "ddp")])
def test_a_hundred_steady_state_steps_never_synchronise(tmp_path, precision, strategy, clean_signals):
    from tests.idx_files import write_fashion_mnist

    data = write_fashion_mnist(tmp_path / "data", n_train=2 * 128)
    window = SyncFreeWindow()

    with runtime.guarded_process():  # the window last, as it was after every callback the CLI runs
        report = ThroughputReport(breakdown=True, check_every_n_steps=EVERY)  # off on CUDA unless asked
        tiny_fit(data, tmp_path, [report, *with_safety((), EVERY), window], plugins=[runtime.VerifiedCheckpointIO()],
                 batch_size=2, network="cnn", accelerator="gpu", precision=precision, strategy=strategy,
                 log_every_n_steps=EVERY, limit_val_batches=0)
    assert window.checked >= 100 and len(report.timer.marks) == 128  # every step's events read
