"""The start block's lines for what no config key shows (docs/cli.md), and the output train.py hides, installed when
this module loads."""

import logging
import signal
import warnings
from typing import Dict, List

from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy

from fashion_mnist_dp import runtime
from fashion_mnist_dp.runtime import compat

# Deprecations inside Lightning 2.6 itself (its calls into torch 2.14), not actionable by our users.
HIDDEN_WARNINGS = (r".*isinstance\(treespec, LeafSpec\).*",
                   r".*torch.distributed.nn.functional.all_gather is deprecated.*")
for _pattern in HIDDEN_WARNINGS:
    warnings.filterwarnings("ignore", message=_pattern)
# Lightning 2.6's own lines that are not ours to print: its cloud logger's advertisement at every start
# (logger_connector.py), and the note that configure_optimizers' step count loads the training data first.
NOT_OURS = ("[litlogger](https://pypi.org/project/litlogger/)", "to estimate number of stepping batches")
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
    lambda record: not any(text in str(record.msg) for text in NOT_OURS))


def _handler_name(handler) -> str:
    names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored", None: "not Python's"}
    return names.get(handler) or f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"


def unseen_settings(trainer: Trainer) -> List[str]:
    """Start-block lines for what a run does that no config key shows, each read from the live object (docs/cli.md);
    ends the run in one line where a guarantee's private access does not fit this Lightning (compat.check_supported)."""
    strategy = trainer.strategy
    lines = [f"  strategy class  : {type(strategy).__module__}.{type(strategy).__qualname__}"]
    timeout = compat.collective_timeout(strategy)
    if timeout is not None:
        lines.append(f"  collective wait : {timeout.total_seconds():g} s (collective_timeout; then exit 75)")
    handlers: Dict[str, List[str]] = {}
    for signum in (*runtime.SIGNALS, runtime.PEER_FAILED):
        handlers.setdefault(_handler_name(signal.getsignal(signum)), []).append(signal.Signals(signum).name)
    lightning = "off" if any(isinstance(c, runtime.Preemption) for c in trainer.callbacks) else "on"
    lines.append("  signals         : " + "; ".join(f"{', '.join(names)} -> {name}" for name, names in handlers.items())
                 + f"; Lightning's own handlers {lightning}")
    hidden = [f for f in warnings.filters if f[0] == "ignore" and f[1] is not None and f[1].pattern in HIDDEN_WARNINGS]
    lines.append(f"  hidden output   : {len(hidden)} warning filter(s) for Lightning's own deprecations, "
                 f"{len(NOT_OURS)} of its info lines (fashion_mnist_dp/cli/start_block.py)")
    report = next((c for c in trainer.callbacks if hasattr(c, "breakdown_on")), None)
    if report is not None:
        on = report.breakdown_on(strategy.root_device.type)
        hook = "; wraps DDP's comm hook (yours too) to time its all-reduce" if on and isinstance(
            strategy, DDPStrategy) else ""
        lines.append(f"  breakdown       : {'on' if on else 'off'} on {strategy.root_device.type} ranks{hook}")
    return lines + compat.check_supported(trainer)
