"""What the multi-GPU scripts share: one process per GPU under torchrun, and one call timed
on every rank after a barrier."""
import os

import torch
import torch.distributed as dist


def init():
    """Join the NCCL process group; this process's GPU becomes current. (rank, world size)."""
    dist.init_process_group("nccl")
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    torch.cuda.set_device(local)
    return dist.get_rank(), dist.get_world_size()


def call_ms(call):
    """Every rank waits at a barrier, then times one `call()` between two CUDA events (ms)."""
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    call()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def gather(values):
    """Every rank's list of floats (the same length on each), on every rank, in rank order."""
    mine = torch.tensor(values, dtype=torch.float64, device="cuda")
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]
