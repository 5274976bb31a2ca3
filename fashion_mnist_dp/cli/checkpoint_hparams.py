"""A checkpoint's stored hyperparameters against what the user gave: given values win, the checkpoint fills in the
rest, and no class path from a checkpoint imports a module (docs/cli.md, "Values with a special meaning")."""

import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Set

from fashion_mnist_dp.cli.shorthand import SHORT_NAME, SHORTHAND, flat
from fashion_mnist_dp.runtime import compat
from fashion_mnist_dp.runtime.errors import CheckpointError

MODEL = "model"
SHORT_FLAG = {full[2:]: flag for flag, full in SHORTHAND.items()}  # model.optimizer.init_args.lr -> --lr


def stored_model(checkpoint: dict, path: str) -> Dict[str, Any]:
    """The model's stored hyperparameters; a class path from a module not imported yet is refused."""
    stored = compat.public_hparams(checkpoint.get("hyper_parameters") or {})
    for key, value in flat(stored, MODEL).items():
        if key.rsplit(".", 1)[-1] in ("class_path", "_class_path") and value not in SHORT_NAME:
            module = str(value).rpartition(".")[0]
            if module not in sys.modules:
                setting = key.rsplit(".", 1)[0]
                raise CheckpointError(
                    f"checkpoint {path} names {setting} {value}, a class from a module this run has not imported, and "
                    f"a checkpoint may not make a run import code: give --{setting} {value} (or the --config that "
                    f"names it) to load it")
    return stored


def check_fits(parser, config, subcommand: str, stored: Dict[str, Any], path: str) -> None:
    """A checkpoint whose settings this model does not take (another version of the project): one line."""
    if not stored:
        return
    try:
        parser.parse_object({subcommand: {MODEL: stored}}, config.clone())
    except Exception as error:  # noqa: BLE001 (jsonargparse raises several kinds)
        raise CheckpointError(f"checkpoint {path} stores model settings this version does not take "
                              f"({' '.join(str(error).split())[:300]}); give --model.network and the other model "
                              f"settings it was trained with instead of relying on the checkpoint") from error


def reapply_given(merged, user, given: Set[str]) -> List[str]:
    """The user's given model values from ``user`` back into ``merged`` (after the checkpoint's); their keys."""
    applied = []
    for key in sorted((k for k in given if k == MODEL or k.startswith(f"{MODEL}.")), key=lambda k: k.count(".")):
        if any(key == a or key.startswith(f"{a}.") for a in applied) or key not in user:  # a setting gives all of it
            continue
        merged[key] = user[key]
        applied.append(key)
    return applied


def start_note(applied: Sequence[str], user, stored: Dict[str, Any], path: str) -> List[str]:
    """The start block's line ``given over the checkpoint: --lr 0.5 (checkpoint: 0.05)`` for every given value the
    checkpoint stored differently (none when nothing differs)."""
    stored_flat = flat(stored, MODEL)
    found = []
    for key in applied:
        value = user[key]
        if hasattr(value, "class_path"):  # a whole network or optimizer: compare what class it is
            key, value = f"{key}.class_path", value.class_path
        before = stored_flat.get(key, stored_flat.get(key.replace(".init_args", "")))
        if before is not None and str(before) != str(value):
            key = key.removesuffix(".class_path")
            found.append(f"{SHORT_FLAG.get(key, '--' + key)} {value} (checkpoint: {before})")
    return [f"  given over the checkpoint: {', '.join(found)} ({Path(path).name} stored the values in brackets)"] \
        if found else []
