"""The cluster tier (``make test-cluster``; ``make test`` runs it too): a real SLURM on this machine, a two-node
SLURM whose nodes are network namespaces (tests/cluster/netns_slurm.py), and torchrun agents on 127.0.0.1 and in
those namespaces. A machine without SLURM that cannot install it (not root, no apt-get) skips the SLURM tests
with the reason; CI runs as root, installs slurm-wlm and munge from Debian's packages, and sets
``FASHION_MNIST_REQUIRE_SLURM=1`` (.ci/run), which turns that skip into a failure."""

import os
import shutil
import socket
from typing import Optional

import pytest

from tests.cluster.local_slurm import LocalSlurm, install_reason
from tests.cluster.netns_slurm import NamespaceSlurm

REQUIRE_SLURM = "FASHION_MNIST_REQUIRE_SLURM"  # "1": a SLURM tier that cannot start fails instead of skipping


def hostname_reason():
    """Lightning takes rank 0's address from SLURM's node list, this machine's host name: it must resolve."""
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError as error:
        return f"this machine's host name {host!r} does not resolve ({error}): srun's ranks could not find rank 0"
    return None


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cluster/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.multiprocess)


def skip_or_fail(reason: Optional[str]) -> None:
    """Nothing when SLURM can run (``reason`` None); else skip with the reason, or fail under REQUIRE_SLURM=1."""
    if reason and os.environ.get(REQUIRE_SLURM) == "1":
        pytest.fail(f"{REQUIRE_SLURM}=1 but the SLURM tests cannot run: {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """munged, slurmctld and slurmd up for the session (tests/cluster/local_slurm.py), stopped after it."""
    skip_or_fail(install_reason() or hostname_reason())
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def namespace_reason() -> Optional[str]:
    """The two-node cluster needs root, ``ip`` (iproute2), ``nsenter`` and ``unshare`` (util-linux)."""
    missing = [name for name in ("ip", "nsenter", "unshare", "mount") if shutil.which(name) is None]
    if os.geteuid() != 0 or missing:
        return f"the two-node SLURM needs root and {', '.join(missing) or 'network namespaces'}: not available here"
    return None


@pytest.fixture(scope="session")
def two_nodes(tmp_path_factory):
    """Two SLURM nodes, each in its own network namespace with its own address (tests/cluster/netns_slurm.py), up for
    the session; afterwards nothing of it may be left: no namespace, link, daemon or job process."""
    skip_or_fail(install_reason() or namespace_reason())
    cluster = NamespaceSlurm(tmp_path_factory.mktemp("two-nodes")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
    left = cluster.left()
    assert left == [], f"the two-node SLURM left: {left}"
