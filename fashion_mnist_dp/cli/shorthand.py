"""The one reader of the command line and its ``--config`` files: the workshop's flags (``--strategy ddp --devices 4``)
rewritten to LightningCLI's (``fit --trainer.strategy ddp --trainer.devices 4``), and the keys the user gave."""

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from fashion_mnist_dp.runtime.errors import ConfigError

SUBCOMMANDS = ("fit", "validate", "test", "predict")

# The fixed, documented set of shorthand flags (README, "Command line"): full key and an example value.
SHORTHAND_TABLE = {
    "--strategy": ("--trainer.strategy", "ddp"),
    "--devices": ("--trainer.devices", "2"),
    "--accelerator": ("--trainer.accelerator", "cpu"),
    "--num_nodes": ("--trainer.num_nodes", "2"),
    "--precision": ("--trainer.precision", "bf16-mixed"),
    "--epochs": ("--trainer.max_epochs", "3"),
    "--batch_size": ("--data.batch_size", "128"),
    "--data_dir": ("--data.data_dir", "./data"),
    "--virtual_devices": ("--data.virtual_devices", "8"),
    "--lr": ("--model.optimizer.init_args.lr", "0.05"),
    "--lr_scaling": ("--model.lr_policy.scaling", "linear"),
    "--warmup_epochs": ("--model.lr_policy.warmup_epochs", "1"),
    "--optimizer": ("--model.optimizer", "sgd"),
    "--network": ("--model.network", "cnn"),
    "--seed": ("--seed_everything", "42"),
    "--deterministic": ("--trainer.deterministic", "true"),
    "--target_accuracy": ("--stop_at_target.target_accuracy", "0.85"),
    "--patience": ("--stop_at_target.patience", "2"),
}
SHORTHAND: Dict[str, str] = {short: full for short, (full, _) in SHORTHAND_TABLE.items()}
EXAMPLE = {flag: example for short, (full, example) in SHORTHAND_TABLE.items() for flag in (short, full)}
# The short names of the shipped networks and optimizers, on the command line (--network fast_cnn, or
# --model.network fast_cnn): each stands for its class path. A config file names the class path itself.
CLASS_NAMES: Dict[str, Dict[str, str]] = {
    "--model.network": {
        "cnn": "lightning_modules.networks.SmallCNN",
        "fast_cnn": "lightning_modules.networks.FastCNN",
        "staged_cnn": "lightning_modules.networks.StagedCNN",
        "gpu_cnn": "lightning_modules.networks.GpuCNN",
        "mlp": "lightning_modules.networks.MLP",
        "wrn": "lightning_modules.networks.WideResNet",
        "resnet18": "lightning_modules.networks.ResNet18",
    },
    "--model.optimizer": {
        "sgd": "torch.optim.SGD",
        "adamw": "torch.optim.AdamW",
        "novograd": "torch_optimizer.NovoGrad",
        "lamb": "torch_optimizer.Lamb",
        "lars": "torch_optimizer.LARS",
    },
}
# The base lr each shipped optimizer trains the default recipe with (cnn, batch 128): ``--optimizer NAME`` without
# ``--lr`` sets it, since a new class keeps the old one's lr (SGD's 0.05 leaves AdamW at 45.5 % after 40 steps).
# Measured in docs/cli.md, "Your own network or optimizer".
KNOWN_GOOD_LR: Dict[str, str] = {"sgd": "0.05", "adamw": "0.001", "novograd": "0.01", "lamb": "0.005", "lars": "0.5"}
# A shipped network whose recipe needs another lr brings it, per optimizer (the default config's is sgd): it wins over
# the optimizer's own. wrn diverges at SGD's 0.05 (docs/cli.md, "Your own network or optimizer").
NETWORK_LR: Dict[Tuple[str, str], str] = {("wrn", "sgd"): "0.005"}
SHORT_NAME: Dict[str, str] = {path: name for names in CLASS_NAMES.values() for name, path in names.items()}


def class_path(key: str, value: str) -> str:
    """``value`` of ``key`` (a full key) as a class path: a short name's, or ``value`` itself when it is one."""
    names = CLASS_NAMES.get(key)
    if names is None or value in names.values() or "." in value or value.lstrip().startswith("{"):
        return value
    if value not in names:
        what = key.rsplit(".", 1)[-1]
        raise ConfigError(f"unknown {what} {value!r}: choose one of {', '.join(names)}, or give a class path "
                          f"(e.g. --{what} {next(iter(names.values()))})")
    return names[value]


def _check_lr(flag: str, value: str) -> None:
    """The learning rate as a number the optimizer can train with (jsonargparse reads ``nan`` as text there)."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0 < number < float("inf"):
        raise ConfigError(f"{flag} must be a number > 0 (the base learning rate, e.g. {flag} 0.05); got {value}")


def shorthand_help() -> str:
    """The table printed under ``--help``."""
    rows = [f"  {short:<16} = {full}" for short, full in SHORTHAND.items()]
    names = [f"  {key[2:]:<16}: {', '.join(table)}" for key, table in CLASS_NAMES.items()]
    return ("shorthand flags (no subcommand means fit):\n" + "\n".join(rows)
            + "\nshort names (or any class path):\n" + "\n".join(names))


def find_subcommand(args: Sequence[str]) -> Optional[str]:
    """The subcommand in ``args``, if any: a subcommand name that is not the value of the option before it."""
    for i, token in enumerate(args):
        follows_option = i > 0 and args[i - 1].startswith("-") and "=" not in args[i - 1]
        if token in SUBCOMMANDS and not follows_option:
            return token
    return None


def expand_args(argv: Sequence[str]) -> "ExpandedArgs":
    """Add ``fit`` when no subcommand is given and rewrite shorthand flags to their full keys in place; a shorthand
    and its full key with different values is an error: which one the user meant cannot be guessed."""
    args = list(argv) if find_subcommand(argv) else ["fit", *argv]

    expanded: List[str] = []
    given: Dict[str, List[tuple]] = {}  # full key -> [(flag as typed, value)]
    tokens = iter(args)
    for token in tokens:
        key, equals, value = token.partition("=")
        target = SHORTHAND.get(key) or (key if key in SHORTHAND.values() else None)
        if target is None:
            expanded.append(token)
            continue
        if not equals:
            value = next(tokens, None)
            if value is None or value.startswith("--"):
                raise ConfigError(f"{key} needs a value, e.g. {key} {EXAMPLE[key]}")
        value = class_path(target, value)
        if target == SHORTHAND["--lr"]:
            _check_lr(key, value)
        given.setdefault(target, []).append((key, value))
        expanded.extend([target, value])

    for target, uses in given.items():
        if len({value for _, value in uses}) > 1 and len({flag for flag, _ in uses}) > 1:
            shown = " and ".join(f"{flag} {value}" for flag, value in uses)
            raise ConfigError(f"conflicting values for {target[2:]}: {shown}; give it once")
    result = with_known_good_lr(expanded, given)
    lr_file = checked_config_files(result)
    result.lr_origin = result.lr_origin or (f"--config {lr_file}" if lr_file else None)
    return result


class ExpandedArgs(list):
    """The expanded command line and where its base lr comes from (``lr_origin``, for the start block; None: the
    default config, or a checkpoint's)."""

    lr_origin: Optional[str] = None


def with_known_good_lr(expanded: List[str], given: Dict[str, List[tuple]]) -> ExpandedArgs:
    """Unless an lr is given: after a shipped network's or optimizer's class path, the known-good base lr of that
    network with that optimizer (``NETWORK_LR``), else of the optimizer (``KNOWN_GOOD_LR``). A later flag or
    ``--config`` still wins: it comes after. Precedence: the user's lr, the network's, the optimizer's."""
    network, optimizer, lr = SHORTHAND["--network"], SHORTHAND["--optimizer"], SHORTHAND["--lr"]
    result = ExpandedArgs(expanded)
    if lr in given:
        result.lr_origin = f"{given[lr][-1][0]} {given[lr][-1][1]}"
        return result
    chosen = {key: SHORT_NAME.get(given[key][-1][1]) for key in (network, optimizer) if key in given}
    pair = (chosen.get(network), chosen.get(optimizer, "sgd"))  # no --optimizer: the default config's sgd
    if pair in NETWORK_LR:
        value, origin, after = NETWORK_LR[pair], f"{pair[0]}'s known-good lr with {pair[1]}", (network, optimizer)
    elif chosen.get(optimizer) is not None:
        value, origin, after = KNOWN_GOOD_LR[chosen[optimizer]], f"{chosen[optimizer]}'s known-good lr", (optimizer,)
    else:
        return result
    at = max(i for i, token in enumerate(expanded) if token in after) + 2
    result[:] = [*expanded[:at], lr, value, *expanded[at:]]
    result.lr_origin = f"{origin} (--lr sets another)"
    return result


def config_file(name: str) -> Dict[str, Any]:
    """The mapping a ``--config`` file holds, else one line (jsonargparse says only "Unexpected config:"); a name that
    is not a file is left to jsonargparse ("File does not exist", or an inline YAML string)."""
    if not Path(name).is_file():
        return {}
    try:
        with open(name) as stream:  # a stream, so that YAML's messages name the file
            loaded = yaml.safe_load(stream)
    except OSError as error:
        raise ConfigError(f"--config {name}: cannot be read ({error.strerror or error})") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"--config {name}: not valid YAML: {' '.join(str(error).split())}") from error
    if loaded is None:
        raise ConfigError(f"--config {name}: the file is empty; it should hold keys such as trainer:, model:, data:")
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {name}: holds a {type(loaded).__name__} ({str(loaded)[:40]!r}), not keys such as "
                          f"trainer:, model:, data:")
    return loaded


def flat(tree: Any, prefix: str = "") -> Dict[str, Any]:
    """Nested dicts as {dotted key: leaf}; a class path and its init_args are separate leaves."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    found: Dict[str, Any] = {}
    for key, value in tree.items():
        found.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def checked_config_files(args: Sequence[str]) -> Optional[str]:
    """Every ``--config`` file of ``args`` checked (:func:`config_file`); the last one that sets the optimizer's lr."""
    sets_lr = None
    for i, token in enumerate(args):
        name = token[len("--config="):] if token.startswith("--config=") else \
            (args[i + 1] if token == "--config" and i + 1 < len(args) else None)
        if name is not None and {"model.optimizer.init_args.lr", "model.optimizer.lr"} & set(flat(config_file(name))):
            sets_lr = name
    return sets_lr
