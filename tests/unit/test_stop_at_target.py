"""--target_accuracy/--patience stop at the right epoch; time_to_accuracy.csv matches the epoch lines."""

from types import SimpleNamespace

import torch

from callbacks.stop_at_target import StopAtTarget
from fashion_mnist_dp.cli.shorthand import expand_args


def stops(callback, accuracies):
    """Whether the callback stops training after each validated epoch with these accuracies (one rank, not rank 0)."""
    decisions = []
    for accuracy in accuracies:
        trainer = SimpleNamespace(sanity_checking=False, callback_metrics={"val/acc": torch.tensor(accuracy)},
                                  should_stop=False, is_global_zero=False,
                                  strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision))
        callback.on_validation_end(trainer, None)
        callback.on_train_epoch_end(trainer, None)
        decisions.append(trainer.should_stop)
    return decisions


def test_stops_after_patience_consecutive_epochs_at_or_above_target():
    assert stops(StopAtTarget(0.85, patience=2), (0.86, 0.80, 0.85, 0.87, 0.9)) == [False, False, False, True, True]
    assert stops(StopAtTarget(0.5, patience=1), (0.5,)) == [True]
    assert stops(StopAtTarget(None), (1.0, 1.0, 1.0)) == [False, False, False]


def test_the_streak_is_checkpointed():
    callback = StopAtTarget(0.85, patience=3)
    stops(callback, (0.9, 0.9))
    resumed = StopAtTarget(0.85, patience=3)
    resumed.load_state_dict(callback.state_dict())
    assert stops(resumed, (0.9,)) == [True]


def test_shorthand_flags_map_to_the_stop_at_target_section():
    assert expand_args(["--target_accuracy", "0.85", "--patience", "3"]) == [
        "fit", "--stop_at_target.target_accuracy", "0.85", "--stop_at_target.patience", "3"]


