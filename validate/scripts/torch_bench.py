"""PyTorch side of the side-by-side benchmarks of the validation kernels.

fwd:   times torch.nn.functional.scaled_dot_product_attention with the FlashAttention backend on the
       shapes of shared/data/h200_torch_flash_causal_fwd.csv: `total` tokens cut into documents of
       `doc_len` tokens, run as a batch of independent causal documents (B = total/doc_len, heads,
       doc_len, head_dim 128), bf16; median of `reps` CUDA-event-timed runs after 3 warm-ups;
       TFLOP/s counts 4*head_dim*heads*sum l(l+1)/2.
bwd:   the same shapes, timing out.backward(dO) of that call (FLOPs counted 2.5x the forward's).
mixed: the variable-length batches skewsim-validate bench-mixed wrote (units_h{H}_c{C}.csv:
       sample, sample_len, a, e), through torch.ops.aten._flash_attention_forward with cu_seqlens
       (each unit: queries [a, e), keys [0, e) of its sample; causal is bottom-right aligned).
Given our kernel's CSV, prints the ratio table.

gqa:   equal documents through torch.ops.aten._flash_attention_forward (cu_seqlens) with
       h_kv = heads / KV_DIV (FlashAttention's native GQA).
Environment overrides: HEAD_DIM (fwd/gqa), HEADS, DOCS (comma lists), KV_DIV (gqa).

grid:  the calibration grid skewsim-validate bench-grid wrote (units_g_h{H}_q{Q}_k{K}_n{N}.csv),
       through the same varlen op; joined with ours on the case name.
usage: python3 torch_bench.py fwd|bwd|gqa OUT.csv [OURS.csv]
       python3 torch_bench.py grid OUT.csv OURS.csv UNITS_DIR
       python3 torch_bench.py mixed OUT.csv OURS.csv UNITS_DIR
"""
import csv
import glob
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TOTAL = 65536
HEADS = [32, 8, 2]
DOCS = [128, 256, 512, 1024, 4096, 16384, 65536]
BWD_DOCS = [512, 4096, 16384]
HEAD_DIM = int(os.environ.get("HEAD_DIM", "128"))
if os.environ.get("HEADS"):
    HEADS = [int(x) for x in os.environ["HEADS"].split(",")]
if os.environ.get("DOCS"):
    DOCS = [int(x) for x in os.environ["DOCS"].split(",")]
KV_DIV = int(os.environ.get("KV_DIV", "1"))  # gqa mode: h_kv = heads / KV_DIV
WARMUP, REPS = 3, 20


def timed(fn, reps=REPS, warmup=WARMUP):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def rand(*shape, g, grad=False):
    t = torch.rand(*shape, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
    return t.requires_grad_(grad)


def bench(h, l, bwd):
    b = TOTAL // l
    g = torch.Generator(device="cuda").manual_seed(h * 1000003 + l)
    q, k, v = (rand(b, h, l, HEAD_DIM, g=g, grad=bwd) for _ in range(3))
    flops = 4 * HEAD_DIM * h * b * l * (l + 1) / 2
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        if not bwd:
            ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            do = rand(*out.shape, g=g)
            # autograd.grad: no accumulation into .grad (which would add 3 elementwise kernels)
            ms = timed(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), reps=10, warmup=2)
            flops *= 2.5
    return ms, flops / (ms * 1e-3) / 1e12


def gqa(h, l):
    """Equal documents through the varlen FlashAttention op, whose K/V may have fewer heads."""
    hk = h // KV_DIV
    b = TOTAL // l
    g = torch.Generator(device="cuda").manual_seed(h * 31 + l)
    q = rand(TOTAL, h, HEAD_DIM, g=g)
    k = rand(TOTAL, hk, HEAD_DIM, g=g)
    v = rand(TOTAL, hk, HEAD_DIM, g=g)
    cu = torch.arange(0, TOTAL + 1, l, device="cuda", dtype=torch.int32)
    ms = timed(lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, l, l, 0.0, True, False))
    flops = 4 * HEAD_DIM * h * b * l * (l + 1) / 2
    return ms, flops / (ms * 1e-3) / 1e12


def run_units(path, h):
    """Times torch's varlen FlashAttention on the units of one units CSV; returns (n, ms, TF/s)."""
    units = [tuple(int(x) for x in (r["sample"], r["sample_len"], r["a"], r["e"])) for r in csv.DictReader(open(path))]
    nq = sum(e - a for _, _, a, e in units)
    nk = sum(e for _, _, _, e in units)  # each unit gets its own copy of its sample's prefix
    g = torch.Generator(device="cuda").manual_seed(h * 7 + nq)
    q = rand(nq, h, HEAD_DIM, g=g)
    k = rand(nk, h, HEAD_DIM, g=g)
    v = rand(nk, h, HEAD_DIM, g=g)
    acc = lambda xs: [0] + list(__import__("itertools").accumulate(xs))
    cq = torch.tensor(acc(e - a for _, _, a, e in units), device="cuda", dtype=torch.int32)
    ck = torch.tensor(acc(e for _, _, _, e in units), device="cuda", dtype=torch.int32)
    mq = max(e - a for _, _, a, e in units)
    mk = max(e for _, _, _, e in units)
    f = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cq, ck, mq, mk, 0.0, True, False)
    ms = timed(f)
    flops = sum(4 * HEAD_DIM * h * ((e * (e + 1) - a * (a + 1)) / 2) for _, _, a, e in units)
    del q, k, v
    torch.cuda.empty_cache()
    return len(units), ms, flops / (ms * 1e-3) / 1e12


def mixed(units_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(units_dir, "units_h*_c*.csv"))):
        name = os.path.basename(path)[:-4]
        h = int(name.split("_")[1][1:])
        c = int(name.split("_")[2][1:])
        try:
            n, ms, tf = run_units(path, h)
        except Exception as ex:  # report the signature this torch has, then stop
            print(f"# _flash_attention_forward failed: {ex}\n# schema: {torch.ops.aten._flash_attention_forward.default._schema}", flush=True)
            return rows
        rows.append((h, c, n, ms, tf))
        print(f"torch-varlen,{h},{c},{n},{ms:.4f},{tf:.1f}", flush=True)
    return rows


def grid(units_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(units_dir, "units_g_*.csv"))):
        case = os.path.basename(path)[len("units_"):-4]
        h = int(case.split("_")[1][1:])
        n, ms, tf = run_units(path, h)
        rows.append((case, n, ms, tf))
        print(f"torch-grid,{case},{n},{ms:.4f},{tf:.1f}", flush=True)
    return rows


def main():
    mode, out = sys.argv[1], sys.argv[2]
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, mode {mode}", flush=True)
    rows = []
    if mode in ("fwd", "bwd", "gqa"):
        for h in HEADS:
            for l in BWD_DOCS if mode == "bwd" else DOCS:
                ms, tf = gqa(h, l) if mode == "gqa" else bench(h, l, mode == "bwd")
                rows.append((h, l, ms, tf))
                print(f"torch-{mode},{h},{l},{ms:.4f},{tf:.1f}", flush=True)
                torch.cuda.empty_cache()
        with open(out, "w") as f:
            f.write("heads,doc_len,total_tokens,head_dim,median_ms,tflops\n")
            for h, l, ms, tf in rows:
                f.write(f"{h},{l},{TOTAL},{HEAD_DIM},{ms:.4f},{tf:.1f}\n")
        key = lambda r: (int(r["heads"]), int(r["doc_len"]))
        ref = {(h, l): tf for h, l, _, tf in rows}
    elif mode == "grid":
        rows = grid(sys.argv[4])
        with open(out, "w") as f:
            f.write("case,units,median_ms,tflops\n")
            for case, n, ms, tf in rows:
                f.write(f"{case},{n},{ms:.4f},{tf:.1f}\n")
        if len(sys.argv) > 3:
            ref = {case: tf for case, _, _, tf in rows}
            print("\ncase                          ours_TF torch_TF  ratio")
            for r in csv.DictReader(open(sys.argv[3])):
                t = ref.get(r["case"])
                if t:
                    print(f"{r['case']:<28} {float(r['tflops']):8.1f} {t:8.1f} {float(r['tflops']) / t:6.2f}")
        return
    else:
        rows = mixed(sys.argv[4])
        with open(out, "w") as f:
            f.write("heads,chunk,units,median_ms,tflops\n")
            for h, c, n, ms, tf in rows:
                f.write(f"{h},{c},{n},{ms:.4f},{tf:.1f}\n")
        key = lambda r: (int(r["heads"]), int(r["chunk"]))
        ref = {(h, c): tf for h, c, _, _, tf in rows}
    if len(sys.argv) > 3:
        print("\nkernel            heads  len/chunk  ours_TF torch_TF  ratio")
        for r in csv.DictReader(open(sys.argv[3])):
            t = ref.get(key(r))
            if t:
                print(f"{r['kernel']:<17} {r['heads']:>5} {list(key(r))[1]:>10} {float(r['tflops']):8.1f} {t:8.1f} {float(r['tflops']) / t:6.2f}")


if __name__ == "__main__":
    main()
