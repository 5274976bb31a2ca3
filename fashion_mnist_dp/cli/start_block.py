"""The start block's lines for what no config key shows (docs/cli.md), and the output train.py hides, installed when
this module loads."""

import logging
import shutil
import signal
import warnings
from typing import Dict, List

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Trainer

from callbacks.owner import each, find
from fashion_mnist_dp import runtime
from fashion_mnist_dp.runtime import compat, lifetime

# Deprecations inside Lightning 2.6 itself (its calls into torch 2.14), not actionable by our users; and its
# multi-line hint on every run outside srun where srun is installed (train.py's own checks cover SLURM launches).
SRUN_HINT = r"The `srun` command is available on your system but is not used.*"
HIDDEN_WARNINGS = (r".*isinstance\(treespec, LeafSpec\).*",
                   r".*torch.distributed.nn.functional.all_gather is deprecated.*", SRUN_HINT)
for _pattern in HIDDEN_WARNINGS:
    warnings.filterwarnings("ignore", message=_pattern)
# Lightning 2.6's own lines that are not ours to print: its cloud logger's advertisement at every start
# (logger_connector.py), and the note that configure_optimizers' step count loads the training data first.
NOT_OURS = ("[litlogger](https://pypi.org/project/litlogger/)", "to estimate number of stepping batches")
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
    lambda record: not any(text in str(record.msg) for text in NOT_OURS))
# The run-safety parts and plugin configs/default.yaml holds, with the guarantee each carries (docs/reliability.md).
SAFETY = {
    runtime.JobFaults: "on a lost rank or a stalled data worker: no collective save, the job ends with one line",
    runtime.DivergenceGuard: "a diverged run stops with advice (exit 70) and saves no diverged checkpoint",
    runtime.Preemption: "SIGTERM, SIGUSR1 or Ctrl-C: every rank stops at one point with a verified last.ckpt",
    runtime.Agreement: "the decision points: without it divergence and signals are never acted on",
    runtime.RngState: "a resumed run draws the batches the uninterrupted run would have",
    runtime.VerifiedCheckpointIO: "checkpoints written atomically with a checksum, verified and code-free on load",
}


def safety_off(trainer: Trainer) -> List[str]:
    """The start block's line for each run-safety part or plugin ``trainer`` runs without (RunSafety left out of a
    config, or a part of it turned off by its key)."""
    present = {type(c) for c in each(trainer.callbacks)} | {type(trainer.strategy.checkpoint_io)}
    return [f"  safety off      : {kind.__name__}: {guarantee}" for kind, guarantee in SAFETY.items()
            if not any(issubclass(p, kind) for p in present)]


def _handler_name(handler) -> str:
    names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored", None: "not Python's"}
    return names.get(handler) or f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"


def unseen_settings(trainer: Trainer) -> List[str]:
    """Start-block lines for what a run does that no config key shows, each read from the live object (docs/cli.md);
    ends the run in one line where a guarantee's private access does not fit this Lightning (compat.check_supported)."""
    strategy = trainer.strategy
    lines = [f"  strategy class  : {type(strategy).__module__}.{type(strategy).__qualname__}"]
    timeout = lifetime.configured_timeout()
    if hasattr(strategy, "process_group_backend") and timeout is not None:  # a strategy of several processes
        lines.append(f"  collective wait : {timeout.total_seconds():g} s (collective_timeout; then exit 75)")
    handlers: Dict[str, List[str]] = {}
    for signum in (*runtime.SIGNALS, runtime.PEER_FAILED):
        handlers.setdefault(_handler_name(signal.getsignal(signum)), []).append(signal.Signals(signum).name)
    lightning = "off" if find(trainer.callbacks, runtime.Preemption) is not None else "on"
    lines.append("  signals         : " + "; ".join(f"{', '.join(names)} -> {name}" for name, names in handlers.items())
                 + f"; Lightning's own handlers {lightning}")
    hidden = [f[1].pattern for f in warnings.filters if f[0] == "ignore" and f[1] and f[1].pattern in HIDDEN_WARNINGS]
    srun = SRUN_HINT in hidden and shutil.which("srun") and not SLURMEnvironment.detect()
    lines.append(f"  hidden output   : {len(hidden)} warning filter(s) for Lightning's own deprecations and hints"
                 f"{' (its srun hint kept out: srun is on PATH, this run is not under it)' if srun else ''}, "
                 f"{len(NOT_OURS)} of its info lines (fashion_mnist_dp/cli/start_block.py)")
    return lines + compat.check_supported(trainer)
