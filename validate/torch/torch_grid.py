"""Measures the kernels a production job runs on one GPU, for skewsim's default cost models.

usage: python3 torch_grid.py SET SEED OUT_DIR [SECTIONS] [BUDGET_S]
  SET       fit | check: the fitting grid (grid lengths, heads, GQA ratios) or the held-out set
            (lengths drawn off the grid, q <= 256 against kv >= 8K, 1-4 heads), both seeded.
  SECTIONS  comma list of attn, cudnn, gemm, layer (default all).

attn   PyTorch's varlen FlashAttention (torch.ops.aten._flash_attention_forward / _backward,
       bf16) over launches of units: a unit is the queries [kv - q, kv) of one sample against
       its keys [0, kv), causal bottom-right (the units skewsim's plans lower to). Written as
       skewsim measurement CSV v2 (kind attn, pass fwd/bwd, a `kv_heads` column; `plan` names
       the launch and its group: `..._g{h/h_kv}`; `segs` lists the units in the order the
       launch passes them), so `skewsim calibrate` reads it unchanged.
cudnn  the same launches through cuDNN's attention (torch.ops.aten._cudnn_attention_*), when
       it runs on this GPU and gives the flash outputs on a q < kv probe.
gemm   bf16 torch.matmul (cuBLAS) for every shipped model's linear shapes at TP 1/2/4/8:
       forward (M,N,K) = (tokens, out/TP, in), input grad (tokens, in, out/TP), weight grad
       (in, out/TP, tokens).
layer  one llama3-8b layer (TP 1) forward + backward on a varlen packed batch of documents
       drawn from traces/wlbllm.json, with a kernel-time breakdown from torch.profiler, the
       wall-clock window of its timed calls (to read the GPU clock log against), its twelve
       GEMMs (forward, input and weight gradients) and (causal batches) its attention call
       timed alone, after the layer and, before it, after 1 s idle (`attn_isolated_cool_ms`).

Timing (every section, `timed`): the kernel's device time with the GPU queue fed, as in a
training step where the host runs ahead: two untimed calls, then batches of back-to-back
calls enqueued behind a GPU sleep that outlasts their enqueueing, each batch between one pair
of CUDA events (calls per batch filling ~1 ms, 1..64; batches filling about 0.15 s, 3..15);
the median, p10 and p90 of batch time over calls, in ms. The SM clock is sampled (NVML) while the
timed batches run: `attn_clocks_SET.csv` per launch and pass, the GEMM CSV's `sm_mhz`, the layer's
`sm_mhz` (the power cap lowers the clock under sustained load; kernel times follow it). Timing each call between its own
events with a synchronize after it measures the host's dispatch floor instead (24-58 µs on
the device hosts, whatever the call's work).
Launch order is shuffled by the seed so a budget cut leaves an unbiased subset.
"""
import csv
import json
import math
import os
import random
import statistics
import sys
import time

import torch

WARM_S = 0.15
BATCH_MS = 1.0  # device time of one batch of back-to-back calls
SLEEP_CYCLES_PER_S = 2.0e9  # torch.cuda._sleep spins on SM cycles; >= 1 s per 2e9 at <= 2 GHz
T0 = time.time()
try:  # the SM clock while timed calls run (NVML; absent: no clock columns filled)
    import pynvml
    pynvml.nvmlInit()
    _NVML = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception:  # noqa: BLE001 - the timing runs without it
    _NVML = None
_CLOCKS = []  # SM MHz samples of the running `timed`, taken while its batches ran
LAST_MHZ = [float("nan")]  # the mean of the last `timed`'s samples


def _sample_clock(start, end):
    """Poll the SM clock until `end` completes, keeping the samples taken after `start` did:
    the clock the timed calls ran at (the power cap lowers it under sustained load)."""
    while not end.query():
        if _NVML is not None and start.query():
            try:
                _CLOCKS.append(pynvml.nvmlDeviceGetClockInfo(_NVML, pynvml.NVML_CLOCK_SM))
            except Exception:  # noqa: BLE001
                pass
        time.sleep(2e-4)


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def _batch(fn, n, host_s):
    """Device ms per call of `n` calls of `fn` enqueued back to back behind a GPU sleep that
    outlasts their enqueueing, so the queue holds them all when the first starts and the host's
    dispatch overlaps the kernels; `host_s` is a host enqueue time per call to size the sleep.
    Returns (ms per call, host s per call, fed): `fed` is false when the host was still
    enqueueing after the sleep had ended (the sleep's events time it)."""
    pre, s, e = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize()
    t = time.perf_counter()
    pre.record()
    torch.cuda._sleep(int((2.0 * host_s * n + 2e-4) * SLEEP_CYCLES_PER_S))
    s.record()
    for _ in range(n):
        fn()
    e.record()
    host = time.perf_counter() - t
    _sample_clock(s, e)
    e.synchronize()
    return s.elapsed_time(e) / n, host / n, host * 1e3 < pre.elapsed_time(s)


def _fed(fn, n, host_s):
    """`_batch` until the queue was fed (the sleep doubled each time, four tries)."""
    for _ in range(4):
        ms, host, fed = _batch(fn, n, host_s)
        if fed:
            return ms, host
        host_s = 2.0 * max(host, host_s)
    raise RuntimeError(f"host enqueue outran a {host_s * n * 1e3:.1f} ms sleep four times")


def timed(fn, target_s=WARM_S, lo=3, hi=15):
    """Median, p10 and p90 device ms of one call of `fn`, the GPU queue kept fed (`_batch`):
    two untimed calls, one call timed alone to size the batches, then `reps` batches of `n`
    back-to-back calls (n filling ~1 ms of device time, 1..64; reps filling `target_s`,
    lo..hi), each batch's time over n. `LAST_MHZ[0]`: the mean SM clock sampled while the
    timed batches ran (NaN without NVML or samples)."""
    fn()
    fn()
    one, host = _fed(fn, 1, 1e-3)
    n = max(1, min(64, int(BATCH_MS / max(one, 1e-3))))
    reps = max(lo, min(hi, int(target_s * 1e3 / max(n * one, 1e-3))))
    _CLOCKS.clear()
    ts = sorted(_fed(fn, n, host)[0] for _ in range(reps))
    LAST_MHZ[0] = statistics.fmean(_CLOCKS) if _CLOCKS else float("nan")
    q = lambda p: ts[min(len(ts) - 1, int(p * (len(ts) - 1) + 0.5))]
    return statistics.median(ts), q(0.1), q(0.9)


# ---------------------------------------------------------------- attention launches
GRID_Q = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
GRID_KV = [8192, 32768, 131072, 524288, 1048576]
GRID_H = [1, 2, 4, 8, 16, 32]


def off_grid(rng, lo, hi):
    """A length log-uniform in [lo, hi], not on the fitting grid."""
    grid = set(GRID_Q + GRID_KV)
    while True:
        v = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        if v not in grid and not any(abs(v - g) <= 0.03 * g for g in grid):
            return v


def launch_cost(units, h, d):
    pairs = sum(q * kv - q * (q - 1) / 2 for q, kv in units)
    return 4.0 * d * h * pairs


def design(set_name, rng, n):
    """`n` launches: (units [(q, kv)], heads, kv_div, head_dim)."""
    out = []
    while len(out) < n:
        d = 128 if rng.random() < 0.75 else 64
        if set_name == "check" and rng.random() < 0.4:
            h = rng.choice([1, 2, 3, 4])
        else:
            h = rng.choice(GRID_H) if set_name == "fit" else rng.choice([1, 2, 4, 6, 8, 12, 16, 24, 32])
        divs = [g for g in (1, 4, 8) if h % g == 0]
        g = rng.choice(divs)
        kind = rng.random()
        units = []
        if kind < 0.55:  # one shape repeated
            if set_name == "fit":
                q = rng.choice(GRID_Q)
                kv = rng.choice([q, 2 * q, 4 * q] + [k for k in GRID_KV if k > q])
            elif rng.random() < 0.35:  # short chunks against long prefixes
                q = off_grid(rng, 48, 256)
                kv = off_grid(rng, 8192, 1_000_000)
            else:
                q = off_grid(rng, 48, 60000)
                kv = q if rng.random() < 0.3 else off_grid(rng, q, 1_000_000)
                kv = max(kv, q)
            nu = rng.choice([1, 2, 4, 8, 16]) if set_name == "fit" else rng.choice([1, 3, 5, 6, 12])
            units = [(q, kv)] * nu
        else:  # mixed varlen: CP-style chunks of documents at random positions
            nu = rng.randint(2, 32)
            for _ in range(nu):
                doc = int(math.exp(rng.uniform(math.log(128), math.log(262144))))
                c = rng.choice([128, 256, 512, 1024, 2048, 4096, 8192]) if set_name == "fit" else off_grid(rng, 100, 9000)
                q = min(c, doc)
                kv = rng.randint(q, doc)
                units.append((q, kv))
        f = launch_cost(units, h, d)
        kvtok = sum(kv for _, kv in units)
        if f > 2.5e13 or kvtok * (h // g) * d > 2**31 or sum(q for q, _ in units) * h * d > 2**31:
            continue
        out.append((units, h, g, d))
    return out


def rand_(n, h, d, gen):
    return (torch.rand(n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1)


class Launch:
    def __init__(self, units, h, g, d, seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        hk = h // g
        nq = sum(q for q, _ in units)
        nk = sum(kv for _, kv in units)
        self.q = rand_(nq, h, d, gen)
        self.k = rand_(nk, hk, d, gen)
        self.v = rand_(nk, hk, d, gen)
        acc = lambda xs: torch.tensor([0] + list(__import__("itertools").accumulate(xs)), device="cuda", dtype=torch.int32)
        self.cq = acc(q for q, _ in units)
        self.ck = acc(kv for _, kv in units)
        self.mq = max(q for q, _ in units)
        self.mk = max(kv for _, kv in units)
        self.do = rand_(nq, h, d, gen)

    def flash_fwd(self):
        return torch.ops.aten._flash_attention_forward(self.q, self.k, self.v, self.cq, self.ck, self.mq, self.mk, 0.0, True, False)

    def flash_bwd_fn(self):
        o, lse, seed, off, _ = self.flash_fwd()
        return lambda: torch.ops.aten._flash_attention_backward(
            self.do, self.q, self.k, self.v, o, lse, self.cq, self.ck, self.mq, self.mk, 0.0, True, seed, off)

    def cudnn_fwd(self):
        return torch.ops.aten._cudnn_attention_forward(
            self.q, self.k, self.v, None, self.cq, self.ck, self.mq, self.mk, True, 0.0, True, False)

    def cudnn_bwd_fn(self):
        r = self.cudnn_fwd()
        o, lse, seed, off = r[0], r[1], r[6], r[7]
        return lambda: torch.ops.aten._cudnn_attention_backward(
            self.do, self.q, self.k, self.v, o, lse, seed, off, None, self.cq, self.ck, self.mq, self.mk, 0.0, True)


HEADER = ("kind,pass,plan,seed,scheme,step,ga,pool,worker,chunk,units,segments,tiles,heads,kv_heads,head_dim,"
          "q_tokens,flops,bytes,predicted_ms,measured_ms,p10_ms,p90_ms,segs")


def segs_text(units):
    """The launch's units in the order it passes them (runs of equal units as `q:kv*n`)."""
    runs = []
    for u in units:
        if runs and runs[-1][0] == u:
            runs[-1][1] += 1
        else:
            runs.append([u, 1])
    return ";".join(f"{q}:{kv}*{n}" for (q, kv), n in runs)


def row(kernel, pas, name, seed, units, h, g, d, res):
    ms, p10, p90 = res
    tiles = sum((q + 127) // 128 for q, _ in units)
    f = launch_cost(units, h, d)
    return (f"attn,{pas},{name},{seed},{kernel},0,0,0,0,0,{len(units)},{len(units)},{tiles},{h},{h // g},{d},"
            f"{sum(q for q, _ in units)},{f:.4e},0,,{ms:.5f},{p10:.5f},{p90:.5f},{segs_text(units)}")


def cudnn_probe():
    """Whether cuDNN's attention gives flash's outputs on a varlen q < kv launch."""
    try:
        L = Launch([(128, 1024), (512, 512), (64, 3000)], 4, 2, 128, 7)
        a = L.flash_fwd()[0].float()
        b = L.cudnn_fwd()[0].float()
        err = (a - b).abs().max().item()
        log(f"cudnn probe: max |flash - cudnn| = {err:.4f} (flash max {a.abs().max().item():.3f})")
        L.cudnn_bwd_fn()()
        return err < 0.05, f"max abs diff {err:.4f}"
    except Exception as ex:  # report what this torch says, then measure flash only
        log(f"cudnn probe failed: {type(ex).__name__}: {str(ex)[:400]}")
        return False, f"{type(ex).__name__}: {str(ex)[:200]}"


def attn(set_name, seed, out_dir, n, budget_s, kernels):
    rng = random.Random(seed)
    launches = design(set_name, rng, n)
    files = {k: open(os.path.join(out_dir, f"attn_{k}_{set_name}.csv"), "w") for k in kernels}
    for f in files.values():
        f.write("#skewsim-measurements,v2\n" + HEADER + "\n")
    clocks = open(os.path.join(out_dir, f"attn_clocks_{set_name}.csv"), "w")
    clocks.write("kernel,plan,pass,sm_mhz\n")
    t_start = time.time()
    done = 0
    for i, (units, h, g, d) in enumerate(launches):
        if time.time() - t_start > budget_s:
            log(f"attn budget reached after {done} of {len(launches)} launches")
            break
        name = f"{set_name}{i:04d}_g{g}"
        try:
            L = Launch(units, h, g, d, seed * 100003 + i)
            for k in kernels:
                fwd = L.flash_fwd if k == "torch-flash" else L.cudnn_fwd
                bwd = L.flash_bwd_fn() if k == "torch-flash" else L.cudnn_bwd_fn()
                rf = timed(fwd)
                clocks.write(f"{k},{name},fwd,{LAST_MHZ[0]:.0f}\n")
                rb = timed(bwd)
                clocks.write(f"{k},{name},bwd,{LAST_MHZ[0]:.0f}\n")
                clocks.flush()
                files[k].write(row(k, "fwd", name, seed, units, h, g, d, rf) + "\n")
                files[k].write(row(k, "bwd", name, seed, units, h, g, d, rb) + "\n")
                files[k].flush()
            del L
        except Exception as ex:
            log(f"launch {name} h{h} g{g} d{d} {segs_text(units)[:80]} failed: {type(ex).__name__}: {str(ex)[:200]}")
            torch.cuda.empty_cache()
        done += 1
        if done % 25 == 0:
            log(f"attn {done}/{len(launches)}")
    for f in files.values():
        f.close()
    clocks.close()


# ---------------------------------------------------------------- GEMMs
MODELS = {  # name: hidden, heads_q, heads_kv, head_dim, ffn intermediate, experts, top_k, vocab
    "llama3-8b": (4096, 32, 8, 128, 14336, 0, 0, 128256),
    "llama-34b": (8192, 64, 8, 128, 22016, 0, 0, 32000),
    "qwen3-30b-a3b": (2048, 32, 4, 128, 768, 128, 8, 151936),
}


def gemm_shapes(set_name, rng, n):
    toks = [1024, 4096, 16384, 65536, 262144, 1048576] if set_name == "fit" else [2048, 12288, 49152, 196608, 720896]
    cands = []
    for m, (hid, hq, hkv, hd, inter, ne, k, voc) in MODELS.items():
        for tp in (1, 2, 4, 8):
            parts = [("qkv", (hq + 2 * hkv) * hd // tp, hid, 1), ("o", hid, hq * hd // tp, 1), ("lm_head", voc // tp, hid, 1)]
            if ne == 0:
                parts += [("gate_up", 2 * inter // tp, hid, 1), ("down", hid, inter // tp, 1)]
            else:  # experts: tokens routed evenly, TP splits the expert's intermediate
                parts += [("router", ne, hid, 1), ("expert_gate_up", 2 * inter // tp, hid, k / ne),
                          ("expert_down", hid, inter // tp, k / ne)]
            for part, out_f, in_f, share in parts:
                for t in toks:
                    mt = max(1, int(t * share))
                    for pas, (M, N, K) in (("fwd", (mt, out_f, in_f)), ("dgrad", (mt, in_f, out_f)), ("wgrad", (in_f, out_f, mt))):
                        cands.append((m, part, tp, t, pas, M, N, K))
    rng.shuffle(cands)
    out = [c for c in cands if 2.0 * c[5] * c[6] * c[7] <= 4e13]
    return out[:n]


def gemm(set_name, seed, out_dir, n, budget_s):
    rng = random.Random(seed + 17)
    shapes = gemm_shapes(set_name, rng, n)
    path = os.path.join(out_dir, f"gemm_{set_name}.csv")
    t_start = time.time()
    with open(path, "w") as f:
        f.write("model,part,tp,tokens,pass,m,n,k,median_ms,p10_ms,p90_ms,tflops,sm_mhz\n")
        for i, (m, part, tp, t, pas, M, N, K) in enumerate(shapes):
            if time.time() - t_start > budget_s:
                log(f"gemm budget reached after {i} of {len(shapes)}")
                break
            gen = torch.Generator(device="cuda").manual_seed(seed * 7919 + i)
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
            b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
            if pas == "wgrad":  # X^T dY: both operands stored tokens-major
                a = a.t().contiguous().t()
            elif pas == "dgrad":  # dY W^T: the weight stored (out, in) as the forward reads it
                b = b.t().contiguous().t()
            ms, p10, p90 = timed(lambda: torch.matmul(a, b), target_s=0.06)
            f.write(f"{m},{part},{tp},{t},{pas},{M},{N},{K},{ms:.5f},{p10:.5f},{p90:.5f},{2.0 * M * N * K / ms / 1e9:.1f},{LAST_MHZ[0]:.0f}\n")
            f.flush()
            del a, b
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- one llama3-8b layer
def window_kw(window):
    """FlashAttention's sliding-window arguments for a window of `window` keys (None: causal)."""
    return {} if window is None else {"window_size_left": window - 1, "window_size_right": 0}


class FlashVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, mx, window=None):
        kw = window_kw(window)
        o, lse, s, off, _ = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, True, False, **kw)
        ctx.save_for_backward(q, k, v, o, lse, cu, s, off)
        ctx.mx, ctx.kw = mx, kw
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu, s, off = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(do.contiguous(), q, k, v, o, lse, cu, cu, ctx.mx, ctx.mx, 0.0, True, s, off, **ctx.kw)
        return dq, dk, dv, None, None, None


def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def layer_docs(tokens, seq_len, offset):
    """Documents of the wlbllm trace from `offset`, packed sequentially into sequences of
    `seq_len` (a document crossing a boundary is cut); the pieces, in order."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = next(p for p in (os.path.join(here, "wlbllm.json"), os.path.join(here, "../../traces/wlbllm.json")) if os.path.exists(p))
    trace = json.load(open(path))
    pieces, fill, i = [], 0, offset
    while sum(pieces) < tokens:
        n = trace[i % len(trace)]
        i += 1
        while n > 0 and sum(pieces) < tokens:
            take = min(n, seq_len - fill)
            pieces.append(take)
            n -= take
            fill = (fill + take) % seq_len
    return pieces


def kernel_times(fn):
    """Per-category device time (attention, gemm, other) of one call of `fn` by torch.profiler,
    with each kernel's name, call count and µs."""
    from torch.profiler import profile, ProfilerActivity
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cats = {}
    for ev in prof.key_averages():
        t = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        if t <= 0:
            continue
        nm = ev.key.lower()
        c = "attention" if "flash" in nm else ("gemm" if any(s in nm for s in ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas")) else "other")
        cats.setdefault(c, {"us": 0.0, "kernels": []})
        cats[c]["us"] += t
        cats[c]["kernels"].append([ev.key[:160], ev.count, round(t, 1)])
    return cats


def layer_configs(set_name, seed):
    """The layer batches of a set, as (tokens, seq_len, trace offset, window or None): the fit
    set's four fixed batches, or held-out batches of other sizes whose trace offsets `seed` draws."""
    if set_name == "fit":
        return [(32768, 32768, 2000, None), (65536, 32768, 50000, None), (16384, 16384, 9000, None),
                (32768, 32768, 2000, 4096)]
    rng = random.Random(seed)
    return [(t, s, rng.randrange(0, 200000), w) for t, s, w in
            ((20480, 20480, None), (57344, 28672, None), (36864, 36864, None), (28672, 28672, 1024))]


def layer(seed, out_dir, configs, name):
    """One llama3-8b layer per config (tokens, seq_len, trace offset, window or None)."""
    hid, hq, hkv, hd, inter = 4096, 32, 8, 128, 14336
    res = []
    for tokens, seq_len, offset, window in configs:
        docs = layer_docs(tokens, seq_len, offset)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        p = lambda *s: (torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02).requires_grad_(True)
        wqkv, wo, wgu, wd = p(hid, (hq + 2 * hkv) * hd), p(hq * hd, hid), p(hid, 2 * inter), p(inter, hid)
        n1, n2 = torch.ones(hid, device="cuda", dtype=torch.bfloat16, requires_grad=True), torch.ones(hid, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        x = torch.randn(tokens, hid, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
        pos = torch.cat([torch.arange(n, device="cuda") for n in docs]).float()
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
        ang = pos[:, None] * inv[None, :]
        cos, sin = ang.cos().bfloat16()[:, None, :], ang.sin().bfloat16()[:, None, :]
        cu = torch.tensor([0] + list(__import__("itertools").accumulate(docs)), device="cuda", dtype=torch.int32)
        mx = max(docs)
        dy = torch.randn(tokens, hid, device="cuda", dtype=torch.bfloat16, generator=gen)

        def fwd():
            h = torch.nn.functional.rms_norm(x, (hid,), n1, 1e-5)
            qkv = h @ wqkv
            q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
            q = rope(q.view(tokens, hq, hd), cos, sin)
            k = rope(k.view(tokens, hkv, hd), cos, sin)
            a = FlashVarlen.apply(q, k, v.reshape(tokens, hkv, hd), cu, mx, window)
            x2 = x + a.reshape(tokens, hq * hd) @ wo
            h2 = torch.nn.functional.rms_norm(x2, (hid,), n2, 1e-5)
            g, u = (h2 @ wgu).chunk(2, dim=-1)
            return x2 + (torch.nn.functional.silu(g) * u) @ wd

        params = [x, wqkv, wo, wgu, wd, n1, n2]
        fb = lambda: torch.autograd.grad(fwd(), params, dy)
        mhz, attn_cool = {}, None
        if window is None:  # the attention call alone after 1 s idle, before the layer heats the GPU
            L = Launch([(n, n) for n in docs], hq, hq // hkv, hd, seed)
            torch.cuda.synchronize()
            time.sleep(1.0)
            attn_cool = {"fwd": timed(L.flash_fwd)[0]}
            mhz["attn_fwd_cool"] = LAST_MHZ[0]
            attn_cool["bwd"] = timed(L.flash_bwd_fn())[0]
            mhz["attn_bwd_cool"] = LAST_MHZ[0]
            del L
        r_f = timed(lambda: fwd(), target_s=0.5, lo=5, hi=20)
        mhz["fwd"] = LAST_MHZ[0]
        t_fb = time.time()
        r_fb = timed(fb, target_s=1.0, lo=5, hi=20)
        mhz["fwd_bwd"] = LAST_MHZ[0]
        t_fb = [round(t_fb, 2), round(time.time(), 2)]
        cats = kernel_times(fb)
        cats_f = kernel_times(fwd)
        gemms = {}
        for nm, w in (("qkv", wqkv), ("o", wo), ("gate_up", wgu), ("down", wd)):
            a = torch.randn(tokens, w.shape[0], device="cuda", dtype=torch.bfloat16, generator=gen)
            g = torch.randn(tokens, w.shape[1], device="cuda", dtype=torch.bfloat16, generator=gen)
            wd_ = w.detach()
            gemms[nm] = {}
            for pas, fn in (("fwd", lambda: a @ wd_), ("dgrad", lambda: g @ wd_.t()), ("wgrad", lambda: a.t() @ g)):
                gemms[nm][pas] = timed(fn, target_s=0.06)[0]
                mhz[f"gemm_{nm}_{pas}"] = LAST_MHZ[0]
            del a, g
        attn_alone = None
        if window is None:  # the layer's attention call alone, timed as the grid's launches
            L = Launch([(n, n) for n in docs], hq, hq // hkv, hd, seed)
            attn_alone = {"fwd": timed(L.flash_fwd)[0]}
            mhz["attn_fwd"] = LAST_MHZ[0]
            attn_alone["bwd"] = timed(L.flash_bwd_fn())[0]
            mhz["attn_bwd"] = LAST_MHZ[0]
            del L
        res.append({"model": "llama3-8b", "tp": 1, "tokens": tokens, "seq_len": seq_len, "trace": "traces/wlbllm.json",
                    "trace_offset": offset, "mask": "causal" if window is None else f"sliding:{window}",
                    "docs": docs, "fwd_ms": r_f, "fwd_bwd_ms": r_fb, "fwd_bwd_unix_s": t_fb, "profile_fwd_bwd": cats,
                    "profile_fwd": cats_f, "gemm_isolated_ms": gemms, "attn_isolated_ms": attn_alone,
                    "attn_isolated_cool_ms": attn_cool,
                    "sm_mhz": {k: round(v) if v == v else None for k, v in mhz.items()}})
        log(f"layer tokens {tokens} window {window} docs {len(docs)}: fwd {r_f[0]:.3f} ms, fwd+bwd {r_fb[0]:.3f} ms, "
            + ", ".join(f"{c} {v['us'] / 1e3:.3f} ms" for c, v in cats.items())
            + f"; the GEMMs alone {sum(sum(p.values()) for p in gemms.values()):.3f} ms")
        del wqkv, wo, wgu, wd, x
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(out_dir, name), "w"), indent=1)


def main():
    set_name, seed, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sections = (sys.argv[4] if len(sys.argv) > 4 else "attn,cudnn,gemm,layer").split(",")
    budget = float(sys.argv[5]) if len(sys.argv) > 5 else 300.0
    assert set_name in ("fit", "check")
    os.makedirs(out_dir, exist_ok=True)
    log(f"set {set_name} seed {seed}; torch {torch.__version__}, {torch.cuda.get_device_name()}, "
        f"cuDNN {torch.backends.cudnn.version()}; sections {sections}; budget {budget} s")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    env = {"set": set_name, "seed": seed, "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
           "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    kernels = ["torch-flash"]
    if "cudnn" in sections:
        ok, why = cudnn_probe()
        env["cudnn_varlen"] = {"usable": ok, "probe": why}
        if ok:
            kernels.append("torch-cudnn")
    json.dump(env, open(os.path.join(out_dir, f"env_{set_name}.json"), "w"), indent=1)
    n_attn = 260 if set_name == "fit" else 140
    if "attn" in sections:
        attn(set_name, seed, out_dir, n_attn, budget * (0.55 if len(kernels) == 1 else 0.7), kernels)
        log("attn done")
    if "gemm" in sections:
        gemm(set_name, seed, out_dir, 420 if set_name == "fit" else 160, budget * 0.2)
        log("gemm done")
    if "layer" in sections:
        configs = layer_configs(set_name, seed)
        log(f"layer {set_name} seed {seed}: {configs}")
        layer(seed, out_dir, configs, f"layer_{set_name}.json")
        log("layer done")


if __name__ == "__main__":
    main()
