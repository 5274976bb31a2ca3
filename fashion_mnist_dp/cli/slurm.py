"""The one check of a SLURM job the Trainer cannot read itself: whether srun started the tasks it expects."""

from typing import Mapping, Optional


def check_slurm_layout(environ: Mapping[str, str], want, nodes: int) -> Optional[str]:
    """Under srun, the tasks SLURM started must be the ranks the Trainer expects: ``srun -n N`` alone (no tasks per
    node, which Lightning needs) or a count that disagrees with ``--devices``/``--num_nodes`` would end in Lightning's
    RuntimeError on every task, or in ranks waiting for peers that never come. ``want``: the parsed ``--devices``
    (an int, "auto" or a list of GPU indices). None: fine, or not under srun."""
    if "SLURM_NTASKS" not in environ or environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None  # not SLURM-managed (Lightning's own rule: an interactive job launches its processes itself)
    tasks = int(environ.get("SLURM_NTASKS", "1"))
    per_node_text = environ.get("SLURM_NTASKS_PER_NODE")
    how = f"srun --nodes {nodes} --ntasks-per-node {want if isinstance(want, int) else 'DEVICES'} python train.py ..."
    if per_node_text is None:
        if tasks > 1:
            return (f"SLURM started {tasks} tasks without --ntasks-per-node, which Lightning needs to place ranks: "
                    f"run '{how}' (docs/running-on-clusters.md)")
        return None
    per_node = int(per_node_text.split("(")[0])
    slurm_nodes = int(environ.get("SLURM_NNODES", environ.get("SLURM_JOB_NUM_NODES", "1")))
    devices_per_node = len(want) if isinstance(want, list) else want
    if isinstance(devices_per_node, int) and devices_per_node > 0 and per_node != devices_per_node:
        return (f"SLURM started {per_node} task(s) per node but --devices is {devices_per_node}: one task per device, "
                f"so run '{how}' or give --devices {per_node}")
    if slurm_nodes != nodes:
        return (f"SLURM allocated {slurm_nodes} node(s) but --num_nodes is {nodes}: give --num_nodes {slurm_nodes}, "
                f"or run '{how}'")
    return None
