"""nccl-tests-style sweep of the collectives skewsim models, through PyTorch's NCCL backend.

usage: torchrun --nproc_per_node N collectives.py OUT.csv [MIN_MIB] [MAX_MIB] [ITERS]
  (defaults 8 MiB to 8192 MiB, doubling; 2 untimed calls then ITERS = 5 timed ones per size)

One process per GPU. Ops and their nccl-tests size S (bytes, bf16 buffers):
  all_gather      S = the gathered output (each rank contributes S / N)
  reduce_scatter  S = one rank's input (each rank keeps S / N)
  all_reduce      S = the buffer
  all_to_all      S = one rank's send buffer, S / N to every rank
  all_to_all_v    S = one rank's send buffer, rank i sending to rank j the share
                  (1 + (j - i) mod N) / (N (N + 1) / 2): every rank sends and receives S, in
                  uneven pieces (the same pattern `skewsim calibrate --collectives` assumes)
Each call is timed between two CUDA events on every rank; a size's time is the slowest rank's
median. Rank 0 writes the rows `skewsim calibrate --collectives` reads:
  op,gpus,bytes,time_us,algbw_gbs,busbw_gbs
(algbw = S / time; busbw = algbw x (N-1)/N for all-gather, reduce-scatter and the all-to-alls,
2(N-1)/N for all-reduce, as nccl-tests' PERFORMANCE.md defines them).
Keep NCCL_NVLS_ENABLE=0 on the shared multi-GPU machines.
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multigpu import call_ms, gather, init  # noqa: E402

OPS = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_to_all_v"]


def bus_factor(op, n):
    if n < 2:
        return 0.0
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def v_splits(rank, n, elems):
    """Element counts rank `rank` sends to each rank (all_to_all_v pattern), summing to `elems`."""
    tot = n * (n + 1) // 2
    unit = elems // tot
    out = [(1 + (j - rank) % n) * unit for j in range(n)]
    out[rank] += elems - sum(out)
    return out


def main():
    out_csv = sys.argv[1]
    lo = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    hi = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    iters = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    rank, n = init()
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    t0 = time.time()
    mib = lo
    sizes = []
    while mib <= hi:
        sizes.append(mib << 20)
        mib *= 2
    for op in OPS:
        for size in sizes:
            elems = size // 2
            elems -= elems % (n * n * (n + 1))  # whole pieces for every op at this N
            s = elems * 2
            if op == "all_gather":
                inp = torch.ones(elems // n, dtype=torch.bfloat16, device=dev)
                out = torch.empty(elems, dtype=torch.bfloat16, device=dev)
                call = lambda: dist.all_gather_into_tensor(out, inp)
            elif op == "reduce_scatter":
                inp = torch.ones(elems, dtype=torch.bfloat16, device=dev)
                out = torch.empty(elems // n, dtype=torch.bfloat16, device=dev)
                call = lambda: dist.reduce_scatter_tensor(out, inp)
            elif op == "all_reduce":
                inp = torch.ones(elems, dtype=torch.bfloat16, device=dev)
                out = None
                call = lambda: dist.all_reduce(inp)
            elif op == "all_to_all":
                inp = torch.ones(elems, dtype=torch.bfloat16, device=dev)
                out = torch.empty(elems, dtype=torch.bfloat16, device=dev)
                call = lambda: dist.all_to_all_single(out, inp)
            else:
                send = v_splits(rank, n, elems)
                recv = [v_splits(j, n, elems)[rank] for j in range(n)]
                inp = torch.ones(elems, dtype=torch.bfloat16, device=dev)
                out = torch.empty(sum(recv), dtype=torch.bfloat16, device=dev)
                call = lambda: dist.all_to_all_single(out, inp, recv, send)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            ts = [call_ms(call) * 1e3 for _ in range(iters)]
            us = max(r[0] for r in gather([statistics.median(ts)]))
            algbw = s / (us * 1e-6) / 1e9
            rows.append((op, n, s, us, algbw, algbw * bus_factor(op, n)))
            if rank == 0:
                print(f"[{time.time() - t0:6.1f}s] {op:15s} {n} GPU(s) {s >> 20:6d} MiB {us:10.1f} us "
                      f"algbw {algbw:8.1f} busbw {algbw * bus_factor(op, n):8.1f} GB/s", flush=True)
            del inp, out
            torch.cuda.empty_cache()
    if rank == 0:
        with open(out_csv, "w") as f:
            f.write("op,gpus,bytes,time_us,algbw_gbs,busbw_gbs\n")
            for r in rows:
                f.write(f"{r[0]},{r[1]},{r[2]},{r[3]:.2f},{r[4]:.3f},{r[5]:.3f}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
