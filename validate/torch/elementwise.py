"""The elementwise kernels of one transformer layer, kind by kind, as `torch_grid.py`'s layer
runs them (eager PyTorch, bf16), timed over token counts: the measurements behind skewsim's
elementwise model (`skewsim calibrate --elementwise`, `cost::elementwise`).

usage: python3 elementwise.py SET SEED OUT_DIR
  SET   fit | check: token counts on the fitting grid (4K-128K, powers of two) or drawn off
        it by SEED (printed), for the dimensions of llama3-8b and llama-34b.

Kinds (what the layer's forward runs between its GEMMs and its attention, and the backward
autograd runs for it):
  rmsnorm  torch.nn.functional.rms_norm(x, (H,), w) on x [T, H] (input and weight gradients)
  rope     the QKV output [T, Q + 2K] split into q, k, v; rotate-half RoPE on q and k
           (torch_grid.rope); the backward joins dq, dk, dv into the QKV gradient
  swiglu   the gate/up output [T, 2I] chunked; silu(g) * u (the backward joins dg, du)
  add      a + b on [T, H] (the forward's residual adds; the backward's gradient sums)
Forward: the kind's ops on fresh inputs; backward: torch.autograd.grad of its outputs with
random output gradients (add has no backward kernel of its own: its forward row prices the
backward's gradient sums too). Timing as
torch_grid.py (`timed`: batches of back-to-back calls, the GPU queue fed; median, p10,
p90 ms). Rows in a seeded shuffled order: `elementwise_SET.csv`.
"""
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_grid import log, rope, timed  # noqa: E402

MODELS = {  # hidden, heads_q, heads_kv, head_dim, intermediate
    "llama3-8b": (4096, 32, 8, 128, 14336),
    "llama-34b": (8192, 64, 8, 128, 22016),
}
FIT_TOKENS = [4096, 8192, 16384, 32768, 65536, 131072]
KINDS = ["rmsnorm", "rope", "swiglu", "add"]


def check_tokens(rng, n):
    out = []
    while len(out) < n:
        t = 16 * int(math.exp(rng.uniform(math.log(5000), math.log(120000))) / 16)
        if all(abs(t - g) > 0.05 * g for g in FIT_TOKENS + out):
            out.append(t)
    return sorted(out)


def build(kind, tokens, dims, gen):
    """(forward fn, inputs needing gradients) of one kind."""
    hid, hq, hkv, hd, inter = dims
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)
    if kind == "rmsnorm":
        x = r(tokens, hid).requires_grad_(True)
        w = torch.ones(hid, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        return (lambda: torch.nn.functional.rms_norm(x, (hid,), w, 1e-5)), [x, w]
    if kind == "rope":
        qkv = r(tokens, (hq + 2 * hkv) * hd).requires_grad_(True)
        pos = torch.arange(tokens, device="cuda").float()
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
        ang = pos[:, None] * inv[None, :]
        cos, sin = ang.cos().bfloat16()[:, None, :], ang.sin().bfloat16()[:, None, :]

        def fwd():
            q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
            return (rope(q.view(tokens, hq, hd), cos, sin), rope(k.view(tokens, hkv, hd), cos, sin),
                    v.reshape(tokens, hkv, hd))
        return fwd, [qkv]
    if kind == "swiglu":
        h = r(tokens, 2 * inter).requires_grad_(True)

        def fwd():
            g, u = h.chunk(2, dim=-1)
            return torch.nn.functional.silu(g) * u
        return fwd, [h]
    if kind == "add":
        a, b = r(tokens, hid), r(tokens, hid)
        return (lambda: a + b), []
    raise ValueError(kind)


def measure(kind, tokens, dims, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fwd, inputs = build(kind, tokens, dims, gen)
    res = {"fwd": timed(fwd)}
    if inputs:
        out = fwd()
        outs = out if isinstance(out, tuple) else (out,)
        grads = [torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=gen) for o in outs]
        res["bwd"] = timed(lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True))
    return res


def main():
    set_name, seed, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    assert set_name in ("fit", "check")
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    tokens = FIT_TOKENS if set_name == "fit" else check_tokens(rng, 5)
    log(f"elementwise set {set_name} seed {seed}: tokens {tokens}; torch {torch.__version__}, "
        f"{torch.cuda.get_device_name()}")
    cases = [(k, m, t) for k in KINDS for m in MODELS for t in tokens]
    rng.shuffle(cases)
    path = os.path.join(out_dir, f"elementwise_{set_name}.csv")
    with open(path, "w") as f:
        f.write("kind,pass,model,tokens,hidden,heads_q,heads_kv,head_dim,intermediate,"
                "median_ms,p10_ms,p90_ms,unix_s\n")
        for i, (kind, m, t) in enumerate(cases):
            dims = MODELS[m]
            res = measure(kind, t, dims, seed * 1009 + i)
            for pas, (ms, p10, p90) in res.items():
                f.write(f"{kind},{pas},{m},{t},{','.join(map(str, dims))},{ms:.5f},{p10:.5f},{p90:.5f},"
                        f"{time.time():.1f}\n")
            f.flush()
            torch.cuda.empty_cache()
    log(f"elementwise {set_name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
