"""The recipes of docs/running-on-clusters.md as the cluster tier runs them: each taken from the document itself,
with CPU and gloo in place of GPUs and NCCL and nothing else changed (a recipe that no longer reads as the tier
expects fails the test that runs it, so the document cannot drift from what was run)."""

import re
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

from benchmarks.launch import REPO, TRAIN_PY
from fashion_mnist_dp.runtime.checkpoint_io import verify
from tests.conftest import run_dir

DOC = REPO / "docs" / "running-on-clusters.md"
# What the tier appends to every recipe: the mlp on the tiny data, seeded and deterministic, 2 ranks x batch 32
SEEDED = ["--network", "mlp", "--batch_size", "32", "--seed", "7", "--deterministic", "true", "--test_after_fit",
          "false", "--trainer.log_every_n_steps", "1"]
STEPS_PER_EPOCH = 4  # 256 images / (2 ranks x 32)


def bash_blocks(doc: Path = DOC) -> List[str]:
    return re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S)


def _sub(pattern: str, replacement: str, text: str) -> str:
    new, count = re.subn(pattern, replacement, text, flags=re.M)
    assert count, f"{DOC.name}: the recipe no longer has {pattern!r}:\n{text}"
    return new


def sbatch_script(extra: Sequence[str], nodes: int = 1, tasks_per_node: int = 2, array: str = "") -> str:
    """The sbatch script on CPU, no ``--gres``: ``--nodes 1`` and two tasks on the one-node SLURM (Debian's slurmd
    runs one node per machine), ``nodes=2`` on the namespace cluster (tests/cluster/netns_slurm.py);
    ``--devices`` follows ``tasks_per_node``; ``extra`` goes after train.py's own flags. ``array``: the seed sweep's
    job array instead, over these task ids (``1-2``)."""
    (block,) = [b for b in bash_blocks() if "#SBATCH" in b and ("#SBATCH --array" in b) == bool(array)]
    if array:
        text = _sub(r"^#SBATCH --array 1-4\b", f"#SBATCH --array {array}", block)
        text = _sub(r"^#SBATCH --nodes 1\b", f"#SBATCH --nodes {nodes}", text)
        devices = (r"--devices 4\b", f"--devices {tasks_per_node} --accelerator cpu")
    else:
        text = _sub(r"^#SBATCH --nodes 2\b", f"#SBATCH --nodes {nodes}", block)
        devices = (r"--devices 4 --num_nodes 2\b", f"--devices {tasks_per_node} --num_nodes {nodes} --accelerator cpu")
    text = _sub(r"^#SBATCH --ntasks-per-node 4\b", f"#SBATCH --ntasks-per-node {tasks_per_node}", text)
    text = _sub(r"^#SBATCH --gres gpu:4.*\n", "", text)
    text = _sub(r"\bpython train\.py\b", f"{shlex.quote(sys.executable)} {shlex.quote(str(TRAIN_PY))}", text)
    text = _sub(*devices, text)
    return _sub(r"\$RESUME$", f"$RESUME {' '.join(map(shlex.quote, extra))}", text)


def torchrun_recipe(marker: str, nproc_per_node: int, endpoint: str, extra: Sequence[str],
                    **replace: str) -> Tuple[Dict[str, str], List[str]]:
    """The torchrun line of the document that contains ``marker``, on CPU: (its environment assignments, argv for
    this Python). ``--nproc-per-node`` and ``--devices`` become ``nproc_per_node``, ``HOST0:29500`` or
    ``--master_addr HOST0 --master_port 29500`` become ``endpoint``; ``replace`` swaps any other flag's value
    (``max_restarts="0"`` for ``--max-restarts``); ``extra`` goes after train.py's own flags."""
    lines = [line for block in bash_blocks() for line in block.replace("\\\n", " ").splitlines()
             if marker in line and "torchrun" in line]
    assert len(lines) == 1, f"{DOC.name}: {len(lines)} torchrun lines contain {marker!r}"
    words = shlex.split(lines[0], comments=True)
    env = dict(word.split("=", 1) for word in words[: words.index("torchrun")])
    argv = ["-m", "torch.distributed.run"] + words[words.index("torchrun") + 1:]
    host, port = endpoint.rsplit(":", 1)
    values = {"--nproc-per-node": str(nproc_per_node), "--nproc_per_node": str(nproc_per_node),
              "--devices": str(nproc_per_node), "--rdzv-endpoint": endpoint, "--master_addr": host,
              "--master_port": port,
              **{f"--{form}": value for flag, value in replace.items() for form in (flag, flag.replace("_", "-"))}}
    for flag in replace:  # a flag the document's line no longer has fails here, not silently
        assert {f"--{flag}", f"--{flag.replace('_', '-')}"} & set(argv), f"{DOC.name}: no --{flag} in: {lines[0]}"
    argv = [argv[0], *(values.get(flag, word) for flag, word in zip(argv, argv[1:]))]
    assert "train.py" in argv, lines[0]
    argv[argv.index("train.py")] = str(TRAIN_PY)
    return env, [*argv, "--accelerator", "cpu", *extra]


def final_checkpoint(folder: Path) -> dict:
    """The one run's ``last.ckpt`` under ``folder``: checked against its sha256, loaded without running code."""
    return final_checkpoint_in(run_dir(folder))


def final_checkpoint_in(run: Path) -> dict:
    """A run folder's ``last.ckpt``: checked against its sha256, loaded without running code."""
    path = run / "checkpoints" / "last.ckpt"
    verify(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_weights(clean: dict, other: dict, steps: int) -> None:
    """Both checkpoints ended at optimizer step ``steps`` with bitwise the same weights."""
    assert other["global_step"] == clean["global_step"] == steps
    assert clean["state_dict"].keys() == other["state_dict"].keys()
    for key, value in clean["state_dict"].items():
        assert torch.equal(value, other["state_dict"][key]), key
