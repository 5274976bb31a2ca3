"""ProcessSettings' heap_reuse part (configs/default.yaml): between setup and teardown a step's freed activations are reused without page
faults, and at teardown the memory they held goes back to the kernel. Each case in a fresh interpreter: glibc's
thresholds are per process and adapt to what it freed before."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Three 16 MiB blocks made, written and freed through the C library, as torch's CPU allocator does with a step's
# activations (not through torch, whose own allocation pattern varies between releases); minor page faults per
# step, and the resident size.
STEPS = """
import ctypes, json, resource, sys
from callbacks import ProcessSettings
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
heap = ProcessSettings(gc_freeze=False)
if sys.argv[1] == "kept":
    heap.setup(None, None, "fit")
def faults_per_step(steps=10, size=16 * 1024 * 1024):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        blocks = [libc.malloc(size) for _ in range(3)]
        for block in blocks:
            ctypes.memset(block, 1, size)
        for block in blocks:
            libc.free(block)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps
resident = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 / 2 ** 20
faults_per_step(2)
faults, during = faults_per_step(), resident()
heap.teardown(None, None, "fit")
print(json.dumps({"faults": faults, "during_mib": during, "after_mib": resident()}))
"""


def steps(arm: str) -> dict:
    done = subprocess.run([sys.executable, "-c", STEPS, arm], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's switches are glibc's")
def test_a_steps_freed_blocks_are_reused_without_page_faults_and_given_back_at_teardown():
    default, kept = steps("default"), steps("kept")
    pages = 3 * 16 * 1024 * 1024 / 4096
    assert default["faults"] > pages / 2  # glibc trims the heap's freed top: the next step faults it in again
    assert kept["faults"] < pages / 10
    assert kept["during_mib"] - kept["after_mib"] > 40  # the 48 MiB the blocks held, trimmed at teardown
