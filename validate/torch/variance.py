"""The same attention kernel on every GPU at once, step after step: the spread between GPUs
that skewsim's runtime-variance model (`cluster::variance`) describes.

usage: torchrun --nproc_per_node N variance.py OUT.csv [STEPS] [DOC_LEN] [HEADS]
  (defaults 500 steps of one causal FlashAttention-2 forward over a DOC_LEN = 32768-token
  document, 32 heads of 128, bf16: the Libra measurement the model's defaults come from)

Per step every rank waits at a barrier, then times one launch between two CUDA events. Rank 0
writes one row per (GPU, step) in the jitter CSV `skewsim-validate jitter-fit` reads
(kernel,heads,doc_len,device,step,ms: per-GPU jitter sigma and spikes, and the persistent
per-GPU sigma across the devices), and prints the per-step spread as `spread_study` defines
it: drop the fastest and the slowest GPU, then (slowest - fastest) / fastest, its mean and
peak over the steps (with fewer than 4 GPUs nothing is dropped).
Keep NCCL_NVLS_ENABLE=0 on the shared multi-GPU machines.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multigpu import call_ms, gather, init  # noqa: E402


def main():
    out_csv = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    doc = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
    heads = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    rank, n = init()
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(doc, heads, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    cu = torch.tensor([0, doc], device="cuda", dtype=torch.int32)
    call = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, doc, doc, 0.0, True, False)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    per = gather([call_ms(call) for _ in range(steps)])
    if rank == 0:
        with open(out_csv, "w") as f:
            f.write("kernel,heads,doc_len,device,step,ms\n")
            for g, series in enumerate(per):
                for s, t in enumerate(series):
                    f.write(f"flash2-fwd,{heads},{doc},{g},{s},{t:.5f}\n")
        trim = 1 if n >= 4 else 0
        spread = []
        for s in range(steps):
            col = sorted(per[g][s] for g in range(n))
            col = col[trim:len(col) - trim]
            spread.append((col[-1] - col[0]) / col[0])
        med = sorted(sorted(x)[len(x) // 2] for x in per)
        print(f"{n} GPU(s), {steps} steps, {heads} heads x {doc} tokens: per-GPU median "
              f"{med[0]:.4f}..{med[-1]:.4f} ms; spread (trim {trim}) mean "
              f"{100 * sum(spread) / steps:.2f}%, peak {100 * max(spread):.2f}%", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
