"""The start block names what a run does that its config cannot show as a key (fashion_mnist_dp/cli/start_block.py,
``unseen_settings``), each line read from the live object: change the object and the line changes."""

import signal
import warnings
from datetime import timedelta

from lightning.pytorch import Trainer

from callbacks import ThroughputReport
from fashion_mnist_dp.cli.start_block import HIDDEN_WARNINGS, unseen_settings
from fashion_mnist_dp.runtime import Preemption, RunSafety
from fashion_mnist_dp.runtime.lifetime import DEFAULT_TIMEOUT_S, set_collective_timeout
from fashion_mnist_dp.strategies import register_strategies


def lines(**kwargs) -> dict:
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, **kwargs)
    return {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in unseen_settings(trainer)}


def test_the_strategy_line_names_the_class_that_runs_and_the_timeout_its_process_group_gets():
    register_strategies()
    try:
        set_collective_timeout(timedelta(seconds=33))
        ddp = lines(strategy="ddp")
        assert ddp["strategy class"] == "lightning.pytorch.strategies.ddp.DDPStrategy"
        assert ddp["collective wait"].startswith("33 s (collective_timeout")
        set_collective_timeout(timedelta(seconds=44))
        assert lines(strategy="ddp")["collective wait"].startswith("44 s")
        fsdp = lines(strategy="fsdp_cpu")
        assert fsdp["strategy class"] == "fashion_mnist_dp.strategies.fsdp.FullyShardedStrategy"
        assert fsdp["collective wait"].startswith("44 s")
    finally:
        set_collective_timeout(timedelta(seconds=DEFAULT_TIMEOUT_S))
    single = lines()
    assert single["strategy class"] == "lightning.pytorch.strategies.single_device.SingleDeviceStrategy"
    assert "collective wait" not in single  # one process: no process group


def own_handler(signum, frame):
    pass


def test_the_signals_line_reads_the_installed_handlers_and_whether_lightnings_are_off():
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        signal.signal(signal.SIGUSR2, own_handler)
        assert f"SIGUSR2 -> {__name__}.own_handler" in lines()["signals"]
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        assert "SIGUSR2 -> ignored" in lines()["signals"]
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert lines()["signals"].endswith("Lightning's own handlers on")
    assert lines(callbacks=[Preemption()])["signals"].endswith("Lightning's own handlers off")
    assert lines(callbacks=[RunSafety()])["signals"].endswith("Lightning's own handlers off")  # its part


def test_the_hidden_output_line_counts_the_live_warning_filters():
    with warnings.catch_warnings():  # pytest resets the filters fashion_mnist_dp.cli.start_block installs when it loads
        warnings.resetwarnings()
        assert lines()["hidden output"].startswith("0 warning filter(s)")
        for pattern in HIDDEN_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        assert lines()["hidden output"].startswith("3 warning filter(s)")


def test_lightnings_srun_hint_is_kept_out_of_a_run_outside_srun_where_srun_is_installed(tmp_path, monkeypatch):
    """Lightning warns on every Trainer outside srun when ``srun`` is on PATH (as on every machine after make test);
    train.py's filter keeps it out and the hidden-output line says so, only where it would have been printed."""
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")  # never run: Lightning only looks for it on PATH
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    for name in ("SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        lines()
        assert any("`srun` command is available" in str(w.message) for w in caught)  # Lightning's, unfiltered
        caught.clear()
        for pattern in HIDDEN_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        hidden = lines()["hidden output"]
        assert not any("srun" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert "(its srun hint kept out: srun is on PATH, this run is not under it)" in hidden
        monkeypatch.setenv("PATH", "/nonexistent")
        assert "srun" not in lines()["hidden output"]  # no srun: nothing was kept out


def test_the_breakdown_line_says_what_its_config_key_resolves_to_here():
    """callbacks.Report's ThroughputReport gives it to the start block (callbacks/throughput.py)."""
    def breakdown(report, **kwargs):
        trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, **kwargs)
        return report.start_lines(trainer)[0]

    assert breakdown(ThroughputReport()) == "  breakdown       : on on cpu ranks"
    assert breakdown(ThroughputReport(breakdown=False)) == "  breakdown       : off on cpu ranks"
    assert "breakdown" not in lines()
