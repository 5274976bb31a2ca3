"""Ghost batch-norm: plain batch-norm per virtual sub-batch in training, unchanged in eval and in the state_dict."""

import copy

import pytest
import torch
from torch import nn

from lightning.fabric.utilities.exceptions import MisconfigurationException

from fashion_mnist_dp.cli.checks import import_class
from fashion_mnist_dp.cli.shorthand import CLASS_NAMES
from lightning_modules.ghost_batch_norm import GhostBatchNorm2d, use_ghost_batch_norm
from lightning_modules.networks import SmallCNN
from tests.unit.conftest import classifier, tiny_fit


def _pair(channels=3, ghost=4, momentum=0.1):
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(channels, momentum=momentum)
    with torch.no_grad():  # non-trivial affine parameters and running statistics
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-0.5, 0.5)
        plain.running_mean.uniform_(-1, 1)
        plain.running_var.uniform_(0.5, 2)
    ghost_bn = use_ghost_batch_norm(nn.Sequential(copy.deepcopy(plain)), ghost)[0]
    assert isinstance(ghost_bn, GhostBatchNorm2d)
    return plain, ghost_bn


@pytest.mark.parametrize("batch, ghost, sizes", [(12, 4, [4, 4, 4]), (10, 4, [5, 5]), (11, 4, [6, 5])])
def test_training_output_is_plain_batch_norm_on_each_ghost_batch(batch, ghost, sizes):
    """Divisible or not: B // g ghost batches of nearly equal size (10 by 4 -> 5+5, 11 by 4 -> 6+5), none below g."""
    plain, ghost_bn = _pair(ghost=ghost)
    x = torch.randn(batch, 3, 5, 5) * 3 + 1
    expected = torch.cat([nn.functional.batch_norm(c, None, None, plain.weight, plain.bias, True, 0.0, plain.eps)
                          for c in torch.split(x, sizes)])
    assert torch.allclose(ghost_bn(x), expected, atol=1e-5)
    # And not plain batch-norm over the whole batch.
    assert not torch.allclose(ghost_bn(x), plain(x.clone()), atol=1e-3)


def test_running_statistics_take_one_update_per_step_from_the_ghost_batches_mean():
    plain, ghost_bn = _pair(ghost=4, momentum=0.1)
    before_mean, before_var = ghost_bn.running_mean.clone(), ghost_bn.running_var.clone()
    x = torch.randn(8, 3, 5, 5) * 2 + 3
    ghost_bn(x)
    chunks = x.split(4)
    chunk_mean = torch.stack([c.mean(dim=(0, 2, 3)) for c in chunks]).mean(0)
    chunk_var = torch.stack([c.var(dim=(0, 2, 3), correction=1) for c in chunks]).mean(0)
    assert torch.allclose(ghost_bn.running_mean, 0.9 * before_mean + 0.1 * chunk_mean, atol=1e-5)
    assert torch.allclose(ghost_bn.running_var, 0.9 * before_var + 0.1 * chunk_var, atol=1e-5)
    assert int(ghost_bn.num_batches_tracked) == 1


def test_eval_and_a_batch_no_larger_than_the_ghost_size_are_plain_batch_norm():
    plain, ghost_bn = _pair(ghost=16)
    x = torch.randn(16, 3, 5, 5)
    assert torch.allclose(ghost_bn(x), plain(x), atol=1e-6)  # one ghost batch: identical, running stats too
    assert torch.allclose(ghost_bn.running_var, plain.running_var) and torch.allclose(ghost_bn.running_mean, plain.running_mean)
    plain.eval(), ghost_bn.eval()
    y = torch.randn(64, 3, 5, 5)
    assert torch.equal(ghost_bn(y), plain(y))


@pytest.mark.parametrize("network", ["cnn", "wrn", "resnet18"])
def test_every_batch_norm_of_every_network_is_swapped_and_checkpoints_interchange(network):
    torch.manual_seed(0)
    plain = import_class(CLASS_NAMES['--model.network'][network])()
    ghost = use_ghost_batch_norm(copy.deepcopy(plain), 32)
    kinds = [type(m) for m in ghost.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert kinds and set(kinds) == {GhostBatchNorm2d}
    assert list(plain.state_dict()) == list(ghost.state_dict())
    plain.load_state_dict(ghost.state_dict(), strict=True)
    ghost.load_state_dict(plain.state_dict(), strict=True)


def test_the_models_key_swaps_its_batch_norms_and_checkpoints_load_into_plain_batch_norm(fashion_root, tmp_path):
    trainer = tiny_fit(fashion_root, tmp_path, network="cnn", model_args={"ghost_batch_size": 8},
                       limit_train_batches=2, limit_val_batches=1)
    model = trainer.lightning_module
    ghosts = [m for m in model.modules() if isinstance(m, GhostBatchNorm2d)]
    assert len(ghosts) == 4 and all(m.ghost_batch_size == 8 for m in ghosts)
    weights, no_decay = trainer.optimizers[0].param_groups
    assert all(id(m.weight) in map(id, no_decay["params"]) and id(m.bias) in map(id, no_decay["params"])
               for m in ghosts), "the optimizer trains the ghost batch-norms' parameters, without weight decay"
    plain = classifier("cnn")
    assert not any(isinstance(m, GhostBatchNorm2d) for m in plain.modules())
    plain.load_state_dict(model.state_dict(), strict=True)
    with pytest.raises(ValueError, match="ghost_batch_size"):
        use_ghost_batch_norm(SmallCNN(), 0)


def test_the_ghost_batch_size_and_virtual_devices_are_refused_together():
    with pytest.raises(MisconfigurationException, match="give one of them"):
        classifier("cnn", virtual_devices=4, ghost_batch_size=8)


def test_ghost_batches_cut_the_batch_into_that_many_equal_shards_whatever_its_size():
    """Virtual devices' batch-norm: N shards of b images each, also for the epoch's last, smaller batch."""
    torch.manual_seed(0)
    plain, ghost = nn.BatchNorm2d(3), GhostBatchNorm2d(3)
    ghost.ghost_batches = 3
    for b in (4, 1):
        x = torch.randn(3 * b, 3, 5, 5)
        expected = torch.cat([plain(shard) for shard in x.split(b)]) if b > 1 else None
        out = ghost(x)
        if expected is not None:
            torch.testing.assert_close(out, expected)
        assert out.shape == x.shape
