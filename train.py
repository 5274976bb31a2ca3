"""Train a Fashion-MNIST classifier, data-parallel, with LightningCLI.

    python train.py                                   # configs/default.yaml, CPU or one GPU
    python train.py --strategy ddp --devices 4        # 4 GPUs over NCCL (gloo with --accelerator cpu)
    python train.py --config configs/recipes/sgd_momentum.yaml --epochs 5
    python train.py --epochs 5 --ckpt_path last       # resume the newest run of this experiment
    python train.py test --ckpt_path runs/cnn-auto-batch128-sgd/20261201-233431-seed42/checkpoints/last.ckpt

What happens when you run it:

1. The command line is rewritten (fashion_mnist_dp/cli/shorthand.py: no subcommand means ``fit``; ``--devices`` is
   ``--trainer.devices``...) and checked before anything starts (fashion_mnist_dp/cli/checks.py).
2. LightningCLI builds the model, the data module and the Trainer from configs/default.yaml, your
   ``--config`` files and flags (fashion_mnist_dp/cli/app.py). Every callback, logger and plugin of the run is in
   that config (``--print_config``), the run-safety ones too (fashion_mnist_dp/runtime/): the ranks agree every
   ``--check_every_n_steps`` steps whether to stop (a signal, divergence).
3. ``--ckpt_path`` is resolved and the data checked once per node, in the launching process, so a
   bad input ends with one line before any rank starts.
4. ``fit`` trains; rank 0 prints one line per epoch; after fit the best checkpoint is tested
   (``--test_after_fit false`` skips it).

Any mistake ends with one line on stderr and an exit code (README, "Exit codes"), never a traceback.
"""

import os
import signal

from fashion_mnist_dp.exit_codes import ExitCode  # imports nothing heavy

if os.environ.get("SLURM_STEP_NUM_TASKS", "1") != "1":
    # Under srun a failed task signals the others. Until fashion_mnist_dp/runtime/signals.py (which says what every
    # signal does) listens, a task still importing ends at once too, with the same code.
    signal.signal(signal.SIGUSR2, lambda signum, frame: os._exit(int(ExitCode.PEER_FAILED)))

from fashion_mnist_dp.cli.app import main, run  # noqa: E402, F401 (main: in-process callers)

if __name__ == "__main__":
    run()
