"""A hang made on purpose on one GPU, for NCCL's flight recorder: a one-rank NCCL group whose stream sleeps before an
all-reduce, with a 10 s timeout. NCCL's watchdog times the collective out and each rank dumps its recorder to
``TORCH_FR_DUMP_TEMP_FILE``<rank> (train.py sets these for its runs: fashion_mnist_dp/runtime/hangs.py); then
``python -m torch.distributed.flight_recorder.fr_trace FOLDER --prefix nccl-trace-rank`` reads them.

    python -m benchmarks.nccl_hang /tmp/nccl-hang        # the dump in /tmp/nccl-hang/nccl-trace-rank0
"""

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.launch import free_port
from fashion_mnist_dp.runtime.hangs import flight_recorder


def main(folder: str) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    print(flight_recorder(Path(folder)).strip(), flush=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, timeout=timedelta(seconds=10))
    tensor = torch.ones(1024, device="cuda")
    dist.all_reduce(tensor)  # one that completes, so the record holds both
    torch.cuda._sleep(2 ** 40)  # the stream is busy for hours: the next collective cannot start
    dist.all_reduce(tensor)
    torch.cuda.synchronize()  # the watchdog aborts the process before this returns


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/nccl-hang")
