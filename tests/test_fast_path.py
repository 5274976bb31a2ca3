"""The speed options: batched augmentation, splits held on the device, channels_last, torch.compile, warm-up start."""


import torch

from tests.conftest import run_train, experiment_dir, run_dir


def test_fit_with_augmentation_through_the_cli_trains_nhwc_by_default(workdir, fashion_root):
    """The options as users type them: an augmented run trains, validates and checkpoints; with no memory-format
    flag (configs/default.yaml) its weights are NHWC, the fast path on CPU."""
    result = run_train(["--data_dir", str(fashion_root), "--accelerator", "cpu", "--epochs", "1",
                        "--batch_size", "32", "--data.random_crop_padding", "2", "--data.horizontal_flip", "true",
                        "--trainer.limit_train_batches", "3", "--test_after_fit", "false"], cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Epoch 1: Cumulative Time" in result.stdout
    checkpoint = torch.load(run_dir(workdir) / "checkpoints" / "last.ckpt", weights_only=False)
    hparams = checkpoint["datamodule_hyper_parameters"]
    assert hparams["random_crop_padding"] == 2 and hparams["horizontal_flip"] is True
    assert checkpoint["hyper_parameters"]["channels_last"] is True
    conv = checkpoint["state_dict"]["net.0.3.weight"]  # 32 input channels: NHWC and NCHW strides differ
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()








