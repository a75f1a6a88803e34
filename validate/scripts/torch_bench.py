"""PyTorch side of the side-by-side benchmark (skewsim issue 7).

Times torch.nn.functional.scaled_dot_product_attention with the FlashAttention backend on the
shapes of shared/data/h200_torch_flash_causal_fwd.csv: `total` tokens cut into documents of
`doc_len` tokens, run as a batch of independent causal documents (B = total/doc_len, heads, doc_len,
head_dim 128), bf16; median of `reps` CUDA-event-timed runs after 3 warm-ups; TFLOP/s counts
4*head_dim*heads*sum l(l+1)/2. Writes a CSV and, given the Rust kernel's CSV
(skewsim-validate bench --csv), prints the ratio table.

usage: python3 torch_bench.py OUT.csv [OURS.csv]
"""
import csv
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TOTAL = 65536
HEADS = [32, 8, 2]
DOCS = [128, 256, 512, 1024, 4096, 16384, 65536]
HEAD_DIM = 128
WARMUP, REPS = 3, 20


def bench(h, l):
    b = TOTAL // l
    g = torch.Generator(device="cuda").manual_seed(h * 1000003 + l)
    q, k, v = (
        torch.rand(b, h, l, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
        for _ in range(3)
    )
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for _ in range(WARMUP):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(REPS):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
    ms = statistics.median(times)
    flops = 4 * HEAD_DIM * h * b * l * (l + 1) / 2
    return ms, flops / (ms * 1e-3) / 1e12


def main():
    out = sys.argv[1]
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for h in HEADS:
        for l in DOCS:
            ms, tf = bench(h, l)
            rows.append((h, l, ms, tf))
            print(f"torch,{h},{l},{ms:.4f},{tf:.1f}", flush=True)
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        f.write("heads,doc_len,total_tokens,head_dim,median_ms,tflops\n")
        for h, l, ms, tf in rows:
            f.write(f"{h},{l},{TOTAL},{HEAD_DIM},{ms:.4f},{tf:.1f}\n")
    if len(sys.argv) > 2:
        ours = list(csv.DictReader(open(sys.argv[2])))
        print("\nkernel            heads doc_len  ours_TF torch_TF  ratio")
        for r in ours:
            t = [x for x in rows if x[0] == int(r["heads"]) and x[1] == int(r["doc_len"])]
            if t:
                ratio = float(r["tflops"]) / t[0][3]
                print(f"{r['kernel']:<17} {r['heads']:>5} {r['doc_len']:>7} {float(r['tflops']):8.1f} {t[0][3]:8.1f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
