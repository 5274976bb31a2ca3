"""--target_accuracy/--patience stop at the right epoch; time_to_accuracy.csv matches the epoch lines."""



from callbacks.stop_at_target import TargetStreak
from fashion_mnist_dp.cli.shorthand import expand_args


def test_streak_counts_consecutive_epochs_at_or_above_target():
    streak = TargetStreak(0.85, patience=2)
    assert [streak.update(a) for a in (0.86, 0.80, 0.85, 0.87, 0.9)] == [False, False, False, True, True]
    assert TargetStreak(0.5, patience=1).update(0.5)


def test_shorthand_flags_map_to_the_stop_at_target_section():
    assert expand_args(["--target_accuracy", "0.85", "--patience", "3"]) == [
        "fit", "--stop_at_target.target_accuracy", "0.85", "--stop_at_target.patience", "3"]


