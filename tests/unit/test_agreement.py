"""The ranks' one agreement: when it decides, what divergence and preemption decide, and that nothing is saved first."""

import math
from pathlib import Path

import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from fashion_mnist_dp import runtime
from fashion_mnist_dp.runtime.agreement import (
    BEFORE_SAVE,
    EPOCH_END,
    TRAIN_STEP,
    VALIDATION,
    Agreement,
    Participant,
)
from fashion_mnist_dp.runtime.checkpoint_io import verify
from fashion_mnist_dp.runtime.divergence import (
    advice,
    first_non_finite,
    merge,
    past_warmup,
)
from fashion_mnist_dp.exit_codes import ExitCode
from fashion_mnist_dp.runtime.errors import Preempted, TrainingDiverged
from tests.unit.conftest import tiny_fit


class Recorder(Participant):
    def __init__(self):
        self.points = []

    def contribute(self, trainer, pl_module, point):
        return torch.zeros(1)

    def decide(self, trainer, pl_module, point, rows):
        assert rows == [[0.0]]  # one rank, its own contribution
        self.points.append((point, trainer.global_step))


@pytest.mark.parametrize("validate, expected", [
    (True, [(TRAIN_STEP, 3), (TRAIN_STEP, 6), (VALIDATION, 8), (EPOCH_END, 8), (TRAIN_STEP, 9), (TRAIN_STEP, 12),
            (TRAIN_STEP, 15), (VALIDATION, 16), (EPOCH_END, 16)]),
    (False, [(TRAIN_STEP, 3), (TRAIN_STEP, 6), (EPOCH_END, 8), (TRAIN_STEP, 9), (TRAIN_STEP, 12), (TRAIN_STEP, 15),
             (EPOCH_END, 16)]),
], ids=["validating", "not-validating"])
def test_decisions_come_every_n_steps_and_at_every_validation_or_epoch_end(fashion_root, tmp_path, validate, expected):
    recorder = Recorder()
    tiny_fit(fashion_root, tmp_path, [recorder, Agreement(check_every_n_steps=3)], max_epochs=2,
             limit_val_batches=1.0 if validate else 0, num_sanity_val_steps=0)
    assert recorder.points == expected


def test_a_save_between_points_is_decided_first(fashion_root, tmp_path):
    recorder = Recorder()
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    tiny_fit(fashion_root, tmp_path, [recorder, Agreement(check_every_n_steps=3), saves],
             limit_val_batches=0, enable_checkpointing=True)
    assert recorder.points == [(TRAIN_STEP, 3), (BEFORE_SAVE, 4), (TRAIN_STEP, 6), (BEFORE_SAVE, 8), (EPOCH_END, 8)]


def test_participants_must_come_before_the_agreement(fashion_root, tmp_path):
    with pytest.raises(MisconfigurationException, match="Recorder must come before Agreement in trainer.callbacks"):
        tiny_fit(fashion_root, tmp_path, [Agreement(), Recorder()])


class NanGradientAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step + 1 == self.step:
            next(pl_module.parameters()).grad.view(-1)[0] = math.nan


def test_divergence_names_the_first_bad_step_and_stops_before_any_save(fashion_root, tmp_path, clean_signals):
    """Checked every 50 steps, saved every step: the save of step 5 is decided first, and never written."""
    folder = tmp_path / "ckpt"
    saves = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    with pytest.raises(TrainingDiverged) as stopped, runtime.guarded_process():
        tiny_fit(fashion_root, tmp_path, [NanGradientAt(5), saves], safety=50, enable_checkpointing=True)
    assert str(stopped.value).startswith("training diverged at optimizer step 5 (epoch 1): a gradient is not finite "
                                         "(net.1.weight); stopped on every rank at step 5, no checkpoint written")
    assert stopped.value.exit_code == ExitCode.DIVERGED
    assert sorted(p.name for p in folder.glob("*.ckpt")) == [f"step={s}.ckpt" for s in (1, 2, 3, 4)]


def test_divergence_found_later_still_names_the_step_it_began(fashion_root, tmp_path, clean_signals):
    with pytest.raises(TrainingDiverged, match=r"at optimizer step 1 \(epoch 1\): a gradient is not finite "
                                               r"\(net.1.weight\); stopped on every rank at step 6"), \
            runtime.guarded_process():
        tiny_fit(fashion_root, tmp_path, [NanGradientAt(1)], safety=6)


class NanStatisticAt(Callback):
    """After step ``step``, a batch-norm's running variance is replaced by a new tensor holding nan."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            norm = next(m for m in pl_module.modules() if isinstance(m, torch.nn.BatchNorm2d))
            norm.running_var = torch.full_like(norm.running_var, math.nan)


def test_a_non_finite_batch_norm_statistic_is_named_also_in_a_buffer_replaced_mid_fit(fashion_root, tmp_path,
                                                                                      clean_signals):
    """The buffers are found once, at the start, and read at each point: the new tensor is the one checked."""
    with pytest.raises(TrainingDiverged, match=r"at optimizer step 4 \(epoch 1\): a weight or batch-norm statistic is "
                                               r"not finite \(net\.\d+\.\d+\.running_var\); stopped on every rank at step 4"), \
            runtime.guarded_process():
        tiny_fit(fashion_root, tmp_path, [NanStatisticAt(3)], safety=4, network="fast_cnn")


def test_merge_takes_the_earliest_first_step_of_any_rank():
    none = [-1.0, 0, 0, 0, -1.0, -1.0, 0]
    rank0 = [9.0, 1, 0, 0, -1.0, -1.0, 0]  # loss nan at step 9
    rank1 = [7.0, 0, 0, 1, 3.0, 2.0, 0]  # gradient 3 at step 7, weight 2 now
    assert merge([none, none]) == none
    assert merge([rank0, rank1]) == [7.0, 0.0, 0.0, 1.0, 3.0, 2.0, 0.0]
    assert merge([none, [-1.0, 0, 0, 0, -1.0, -1.0, 1]])[6] == 1.0  # at chance on any rank


def test_first_non_finite_finds_nan_and_inf_and_skips_missing_tensors():
    ok = torch.ones(3)
    assert first_non_finite([ok, None, ok]).item() == -1
    assert first_non_finite([], torch.device("cpu")).item() == -1  # a model without parameters or float buffers
    assert first_non_finite([ok, None, torch.tensor([1.0, math.inf]), torch.tensor([math.nan])]).item() == 2
    assert first_non_finite([torch.empty(0), torch.tensor([math.nan])]).item() == 1  # an empty fsdp shard is fine
    assert first_non_finite([torch.full((10**5,), 60000.0, dtype=torch.float16)]).item() == -1  # fp16 would overflow
    for bad in (math.nan, math.inf, -math.inf):
        assert first_non_finite([torch.ones(3), torch.tensor([1.0, bad])]).item() == 1
    assert first_non_finite([torch.tensor([math.inf, -math.inf])]).item() == 0  # inf - inf: nan


def test_accuracy_is_judged_one_epoch_after_warmup_and_advice_names_the_remedies():
    assert past_warmup(1.0, warmup_epochs=0.0, epochs_after_warmup=1.0)
    assert not past_warmup(1.0, warmup_epochs=0.5, epochs_after_warmup=1.0)
    assert advice(0.5, fsdp=False) == ("try a warm-up (--warmup_epochs 1 or more), a lower --lr (now 0.5), "
                                      "or a layer-wise optimizer (--optimizer novograd or lamb)")
    assert "novograd" not in advice(0.5, fsdp=True) and "lamb" in advice(0.5, fsdp=True)
    assert "a lower --lr (now 0.01, scaled to 0.8 for the effective batch 5120)," in advice(0.01, False, 0.8, 5120)
    assert "a lower --lr (now 0.5)," in advice(0.5, False, 0.5, 128)  # no rule changed it: the lr alone


class Signal(Callback):
    """Notes a signal (as the handler would) just before optimizer step ``step``."""

    def __init__(self, step, index):
        self.step, self.index = step, index

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step + 1 == self.step:
            runtime.signals.installed().received[self.index] = True


@pytest.mark.parametrize("index, name, code", [(1, "SIGTERM", 143), (0, r"SIGINT \(Ctrl-C\)", 130),
                                               (2, "SIGUSR1", 143)])
def test_a_signal_stops_at_the_next_decision_with_a_verified_last_checkpoint(fashion_root, tmp_path, clean_signals,
                                                                               index, name, code):
    with pytest.raises(Preempted, match=rf"stopped by {name} at optimizer step 4 \(epoch 1\): checkpoint saved "
                                        r"and verified") as stopped, runtime.guarded_process():
        tiny_fit(fashion_root, tmp_path, [Signal(2, index)], safety=4)
    assert stopped.value.exit_code == code
    last = Path(tmp_path) / "checkpoints" / "last.ckpt"
    assert verify(last) is not None and torch.load(last, weights_only=True)["global_step"] == 4


def test_a_signal_after_the_epochs_last_batch_stops_at_the_epoch_end(fashion_root, tmp_path, clean_signals):
    """Decided at step 8, the epoch's last batch, and again after its validation: the stop waits for the epoch's
    end, so the checkpoint is an end-of-epoch one and a resume starts the next epoch."""
    with pytest.raises(Preempted, match=r"stopped by SIGTERM at optimizer step 8 \(epoch 1\)"), \
            runtime.guarded_process():
        tiny_fit(fashion_root, tmp_path, [Signal(7, 1)], safety=4, max_epochs=2)
    saved = torch.load(Path(tmp_path) / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] == 1


def test_accuracy_at_chance_is_not_judged_when_the_epochs_are_cut_short(fashion_root, tmp_path, clean_signals):
    """lr 1e-9 learns nothing (seed 2: an initial network at 0.05): a full epoch is judged (exit 70), one cut to
    2 batches (a smoke test) is not."""
    with runtime.guarded_process():
        seed_everything(2, verbose=False)
        with pytest.raises(TrainingDiverged, match="at chance"):
            tiny_fit(fashion_root, tmp_path / "full", safety=50, lr=1e-9, num_sanity_val_steps=0)
        seed_everything(2, verbose=False)
        trainer = tiny_fit(fashion_root, tmp_path / "smoke", safety=50, lr=1e-9, num_sanity_val_steps=0,
                           limit_train_batches=2)
    assert trainer.global_step == 2 and trainer.callback_metrics["val/acc"] <= 0.11
