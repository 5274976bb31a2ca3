"""A checkpoint's stored model settings as one layer of a resumed run's config, between the defaults and the user's
files and flags; no class path from a checkpoint imports a module (docs/cli.md, "Values with a special meaning")."""

import sys
from pathlib import Path
from typing import Any, Collection, Dict, List

from callbacks.run_record import public_hparams
from fashion_mnist_dp.cli.shorthand import SHORT_NAME, SHORTHAND, flat
from fashion_mnist_dp.runtime.errors import CheckpointError

MODEL = "model"
SHORT_FLAG = {full[2:]: flag for flag, full in SHORTHAND.items()}  # model.optimizer.init_args.lr -> --lr


def stored_model(checkpoint: dict, path: str) -> Dict[str, Any]:
    """The model's stored hyperparameters; a class path from a module not imported yet is refused."""
    stored = public_hparams(checkpoint.get("hyper_parameters") or {})
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


def parse_over(parser, args, subcommand: str, stored: Dict[str, Any], path: str):
    """The resumed run's config: the defaults, ``stored`` over them, the user's ``args`` over both; settings this
    version of the model does not take: one line."""
    try:
        base = parser.parse_object({"subcommand": subcommand, subcommand: {MODEL: stored}})
    except Exception as error:  # noqa: BLE001 (jsonargparse raises several kinds)
        raise CheckpointError(f"checkpoint {path} stores model settings this version does not take "
                              f"({' '.join(str(error).split())[:300]}); give --model.network and the other model "
                              f"settings it was trained with instead of relying on the checkpoint") from error
    return parser.parse_args(args, namespace=base)


def start_note(model, stored: Dict[str, Any], path: str, linked: Collection[str] = ()) -> List[str]:
    """The line ``given over the checkpoint: --lr 0.5 (checkpoint: 0.05)``: each setting of the final ``model`` that
    differs from the stored one (a changed class named once; ``linked``: taken from the data's settings)."""
    before, now = flat(stored, MODEL), flat(model.as_dict(), MODEL)
    classes = [k.removesuffix(".class_path") for k in before if k.endswith(".class_path") and str(before[k]) != str(
        now.get(k))]
    found = []
    for key, value in before.items():
        inside_changed = any(key.startswith(f"{c}.") and key != f"{c}.class_path" for c in classes)
        if key in linked or inside_changed or key not in now or str(value) == str(now[key]):
            continue
        setting = key.removesuffix(".class_path")
        found.append(f"{SHORT_FLAG.get(setting, '--' + setting)} {now[key]} (checkpoint: {value})")
    return [f"  given over the checkpoint: {', '.join(found)} ({Path(path).name} stored the values in brackets)"] \
        if found else []
