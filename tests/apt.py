"""Debian packages a test tier needs, installed with apt-get when they are missing and this process may (root, apt-get):
the SLURM tier's slurm-wlm and munge, the browser test's Chromium."""

import os
import shutil
import subprocess
from typing import Callable, List, Optional, Sequence


def install_reason(packages: Sequence[str], missing: Callable[[], List[str]]) -> Optional[str]:
    """Install ``packages`` when ``missing()`` names something; None when nothing is missing now, else why the tier
    cannot run (its skip reason)."""
    if not missing():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{', '.join(missing())} missing here and not root with apt-get to install {' '.join(packages)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    try:
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:  # a fresh machine may not have the package lists yet
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, text=True, timeout=600)
            result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return f"apt-get install {' '.join(packages)} took more than 10 minutes (no package registry?)"
    if missing():
        tail = " ".join((result.stderr or result.stdout).split())[-300:]
        return f"apt-get install {' '.join(packages)} failed (exit {result.returncode}): {tail}"
    return None
