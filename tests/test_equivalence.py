"""What data parallelism promises, checked with real processes over gloo.

N ranks at batch B take the same steps as one process at batch N×B (the DDP
guide's central claim), and linear LR scaling turns k steps of N×B into an
approximation of N×k steps of B whose error is second order in the learning rate.
"""

import pytest

pytestmark = pytest.mark.multiprocess

DDP2 = ("--strategy", "ddp", "--devices", "2")
# SGD with momentum and weight decay, so the test covers optimizer state too.
MOMENTUM = ("--optimizer", "sgd", "--lr", "0.05", "--model.lr_policy.base_batch_size", "32")


def test_two_ranks_at_batch_b_reach_the_weights_of_one_process_at_batch_2b(strategy_runs):
    one = strategy_runs.get("--devices", "1", "--batch_size", "32", *MOMENTUM)
    two = strategy_runs.get(*DDP2, "--batch_size", "16", *MOMENTUM)
    assert "effective 32" in one.output and "effective 32" in two.output
    assert one.distance(two) < 1e-5
    # Same per-step loss too (averaged over ranks): the same images in every step.
    assert two.shards[0]["losses"] == pytest.approx(one.shards[0]["losses"], abs=1e-5)
    assert len(one.shards[0]["losses"]) == 8


def _plain_sgd(lr: float):
    return ("--optimizer", "sgd", "--model.optimizer.init_args.momentum", "0", "--model.optimizer.init_args.weight_decay", "0",
            "--lr", str(lr), "--model.lr_policy.base_batch_size", "16", "--batch_size", "16")


@pytest.mark.parametrize("lr", [0.02])
def test_linear_scaling_matches_twice_the_steps_of_one_process_only_to_first_order(strategy_runs, lr):
    """2 ranks × B at 2·lr for k steps vs 1 process × B at lr for 2k steps (same images, same order).

    One step at 2·lr on 2B images is w - lr·(g1 + g2); two steps at lr give
    w - lr·g1 - lr·g2(w - lr·g1) = w - lr·(g1 + g2) + O(lr²). The gap, relative to how
    far the weights moved, is therefore O(lr): halving lr halves it. Equal step
    counts (k steps of B at lr) are not comparable at all.
    """
    results = {}
    for rate in (lr, lr / 2):
        scaled = strategy_runs.get(*DDP2, *_plain_sgd(rate), "--lr_scaling", "linear")
        assert f"-> {2 * rate:g} (linear scaling)" in scaled.output
        single = strategy_runs.get("--devices", "1", *_plain_sgd(rate), "--lr_scaling", "none")
        assert len(scaled.shards[0]["losses"]) == 8 and len(single.shards[0]["losses"]) == 16
        assert scaled.distance(single) < scaled.distance(strategy_runs.get("--devices", "1", *_plain_sgd(rate), "--lr_scaling", "none", "--trainer.max_steps", "8"))
        results[rate] = scaled.distance(single) / scaled.moved()
    small, large = results[lr / 2], results[lr]
    assert large < 0.1, results  # close: linear scaling works at this lr
    assert 1.5 < large / small < 2.7, results  # and the error is second order in lr
