"""The cluster tier (``make test-cluster``; ``make test`` runs it too): a real SLURM on this machine, and torchrun
agents on 127.0.0.1. A machine without SLURM that cannot install it (not root, no apt-get) skips the SLURM tests
with the reason; CI runs as root and installs slurm-wlm and munge from Debian's packages."""

import pytest

from tests.cluster.local_slurm import LocalSlurm, install_reason


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cluster/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.multiprocess)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """munged, slurmctld and slurmd up for the session (tests/cluster/local_slurm.py), stopped after it."""
    reason = install_reason()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()
