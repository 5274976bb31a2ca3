"""The one reader of the command line and its ``--config`` files: the workshop's flags (``--strategy ddp --devices 4``)
rewritten to LightningCLI's (``fit --trainer.strategy ddp --trainer.devices 4``), and the keys the user gave."""

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

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
# The short names of the shipped networks and optimizers (--network fast_cnn, --optimizer adamw, or the full keys):
# each is a config file of its own, which the name loads where it stands: the class path and, where it brings one,
# its known-good base lr (configs/networks/, configs/optimizers/: docs/cli.md).
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NAMED_FILES = {"--model.network": CONFIGS / "networks", "--model.optimizer": CONFIGS / "optimizers"}


def _class_in(path: Path, key: str) -> str:
    return yaml.safe_load(path.read_text())["model"][key.rsplit(".", 1)[-1]]["class_path"]


SHORT_FILES: Dict[str, Dict[str, Path]] = {key: {p.stem: p for p in sorted(folder.glob("*.yaml"))}
                                           for key, folder in NAMED_FILES.items()}
CLASS_NAMES: Dict[str, Dict[str, str]] = {key: {name: _class_in(path, key) for name, path in files.items()}
                                          for key, files in SHORT_FILES.items()}
SHORT_NAME: Dict[str, str] = {path: name for names in CLASS_NAMES.values() for name, path in names.items()}


def named_file(key: str, value: str) -> Optional[Path]:
    """The config file a short name of ``key`` (a full key) stands for; None for a class path (or inline YAML)."""
    files = SHORT_FILES.get(key)
    if files is None or "." in value or value.lstrip().startswith("{"):
        return None
    if value not in files:
        what = key.rsplit(".", 1)[-1]
        raise ConfigError(f"unknown {what} {value!r}: choose one of {', '.join(files)}, or give a class path "
                          f"(e.g. --{what} {CLASS_NAMES[key][next(iter(files))]})")
    return files[value]


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
    names = [f"  {key[2:]:<16}: {', '.join(table)} ({NAMED_FILES[key].relative_to(CONFIGS.parent)}/)"
             for key, table in CLASS_NAMES.items()]
    return ("shorthand flags (no subcommand means fit):\n" + "\n".join(rows)
            + "\nshort names (or any class path), each a config file:\n" + "\n".join(names))


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
    loaded_at: List[tuple] = []  # (position after it, flag as typed, file) of each short name's file
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
        if target == SHORTHAND["--lr"]:
            _check_lr(key, value)
        given.setdefault(target, []).append((key, value))
        named = named_file(target, value)
        expanded.extend(["--config", str(named)] if named else [target, value])
        if named is not None:
            loaded_at.append((len(expanded), f"{key} {value}", named))

    for target, uses in given.items():
        if len({value for _, value in uses}) > 1 and len({flag for flag, _ in uses}) > 1:
            shown = " and ".join(f"{flag} {value}" for flag, value in uses)
            raise ConfigError(f"conflicting values for {target[2:]}: {shown}; give it once")
    result = ExpandedArgs(expanded)
    lr = SHORTHAND["--lr"]
    if lr in given:  # the lr you give wins over a short name's file after it (a file of yours after both wins)
        flag, value = given[lr][-1]
        if loaded_at and loaded_at[-1][0] > max(i for i, token in enumerate(expanded) if token == lr):
            result[loaded_at[-1][0]:loaded_at[-1][0]] = [lr, value]
        result.lr_origin = f"{flag} {value}"
    lr_file = checked_config_files(result)
    if result.lr_origin is None and lr_file:
        named = next((f"{flag} ({path.relative_to(CONFIGS.parent)})" for _, flag, path in loaded_at
                      if str(path) == lr_file), None)
        result.lr_origin = f"{named} (--lr sets another)" if named else f"--config {lr_file}"
    return result


class ExpandedArgs(list):
    """The expanded command line and where its base lr comes from (``lr_origin``, for the start block; None: the
    default config, or a checkpoint's)."""

    lr_origin: Optional[str] = None


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
