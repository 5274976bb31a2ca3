"""One table of exit codes: every error a user may see ends the process with one line and its code."""

import pytest
import torch.distributed as dist
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException

from datamodules.files import CorruptDataError, DataNotFoundError
from fashion_mnist_dp.runtime import errors
from fashion_mnist_dp.cli.failures import reported

# README's exit-code table, class by class.
TABLE = [
    (errors.ConfigError("bad"), 2), (DataNotFoundError("gone"), 65),
    (CorruptDataError("bad"), 65), (errors.CheckpointError("gone"), 66),
    (errors.CheckpointError.damaged("x.ckpt", "bad"), 66), (errors.CantWriteError("ro"), 73),
    (errors.TrainingDiverged("nan"), 70), (errors.JobFault("lost"), 75),
    (errors.Preempted("stopped", 143), 143), (errors.Preempted("stopped", 130), 130), (errors.NothingToTrain("done"), 0),
    (KeyboardInterrupt(), 130), (ArgumentError(None, "Parser key x"), 2), (MisconfigurationException("bad"), 2),
    (RuntimeError("Connection closed by peer [127.0.0.1]:1"), 75),
    (dist.DistStoreError("Timed out after 21 seconds waiting for clients. 1/2 clients joined."), 75),
]


def failing(error):
    def run():
        raise error
    return run


@pytest.mark.parametrize("error, code", TABLE, ids=[type(e).__name__ for e, _ in TABLE])
def test_each_error_ends_with_its_code_and_one_line_without_traceback(capsys, error, code):
    assert reported(failing(error)) == code
    out, err = capsys.readouterr()
    lines = (out + err).splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: ") and "Traceback" not in err
    assert (lines[0] in out.splitlines()) == (code == 0)  # "nothing to train" is not an error


def test_usage_errors_point_to_help_and_other_lines_keep_their_prefix(capsys):
    reported(failing(errors.ConfigError("trainer.devices is 0:\n  give 1 or more")))
    assert capsys.readouterr().err == ("train.py: error: trainer.devices is 0: give 1 or more "
                                       "(see python train.py --help)\n")
    reported(failing(errors.Preempted("stopped by SIGTERM at optimizer step 6", 143)))
    assert capsys.readouterr().err == "train.py: stopped by SIGTERM at optimizer step 6\n"
    reported(failing(RuntimeError("Connection reset by peer")), rank=lambda: 3)
    assert capsys.readouterr().err.startswith("train.py: error: rank 3 lost its connection to another rank")


class Child:
    def __init__(self):
        self.waited = None

    def wait(self, timeout=None):
        self.waited = timeout


def test_a_stop_of_every_rank_is_printed_by_rank_0_only_and_its_ranks_are_waited_for(capsys):
    child = Child()
    assert reported(failing(errors.TrainingDiverged("nan", rank=1, children=[child]))) == 70
    assert capsys.readouterr().err == "" and child.waited is not None
    assert reported(lambda: [child]) == 0  # a normal end waits for the launched ranks too


def test_anything_else_keeps_its_traceback_and_a_signal_exit_passes_through():
    with pytest.raises(ZeroDivisionError):
        reported(failing(ZeroDivisionError()))
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        reported(failing(RuntimeError("CUDA out of memory")))
    with pytest.raises(SystemExit):
        reported(failing(SystemExit(143)))
