"""Sliding-window launches of PyTorch's varlen FlashAttention (forward and backward) and whole
llama3-8b layers on more batches, for skewsim's mask-aware block pricing and its layer model.

usage: python3 window_grid.py SET SEED OUT_DIR [BUDGET_S]
  SET   fit | check: window lengths, heads and unit lengths on the fitting grid, or drawn off
        it (seeded; the check set is measured in a run of its own).

A unit is the queries [kv - q, kv) of one sample against its keys [0, kv), causal
bottom-right, under a window of W keys (query p sees keys [p - W + 1, p]:
window_size_left = W - 1, window_size_right = 0). Launches mix whole documents (q = kv),
one shape repeated, and CP-style chunks. Written as skewsim measurement CSV v2 with a
`mask` column (`sliding:W`), so `skewsim calibrate` reads it; same timing as torch_grid.py
(torch_grid's `timed`: batches of back-to-back calls, the GPU queue fed; median, p10, p90).

`floor_SET.json`: the run's per-call floor, timed the same way: a one-element add, and the
smallest flash forward and backward (64 queries, one head).
"""
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_grid import HEADER, Launch, log, segs_text, timed, window_kw  # noqa: E402

GRID_W = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
GRID_H = [1, 2, 4, 8, 16, 32]


def off_grid(rng, lo, hi, grid):
    while True:
        v = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        if not any(abs(v - g) <= 0.03 * g for g in grid):
            return v


def window_pairs(q, kv, w):
    """Query-key pairs of queries [kv - q, kv) under causal + a window of w keys."""
    a = kv - q
    # positions p < w - 1 see p + 1 keys, the rest w
    full = max(0, min(kv, w - 1) - a)  # positions in [a, min(kv, w - 1)) see p + 1 keys
    lo, hi = a, a + full
    tri = (hi * (hi + 1) - lo * (lo + 1)) // 2
    return tri + (q - full) * w


def design(set_name, rng, n):
    out = []
    fit = set_name == "fit"
    while len(out) < n:
        d = 128 if rng.random() < 0.75 else 64
        h = rng.choice(GRID_H) if fit else rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
        g = rng.choice([x for x in (1, 4, 8) if h % x == 0])
        w = rng.choice(GRID_W) if fit else off_grid(rng, 300, 40000, GRID_W)
        kind = rng.random()
        if kind < 0.35:  # whole documents packed into one launch
            total = rng.choice([8192, 32768, 131072]) if fit else off_grid(rng, 6000, 200000, [8192, 32768, 131072])
            units, left = [], total
            while left > 0:
                l = min(left, max(16, int(rng.lognormvariate(7.5, 1.4))))
                units.append((l, l))
                left -= l
        elif kind < 0.7:  # one shape repeated
            q = rng.choice([64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]) if fit else off_grid(rng, 48, 20000, [])
            kv = q * rng.choice([1, 2, 4, 16, 64]) if fit else int(q * math.exp(rng.uniform(0, math.log(64))))
            kv = min(max(kv, q), 1_048_576)
            units = [(q, kv)] * (rng.choice([1, 2, 4, 8]) if fit else rng.choice([1, 3, 5, 6]))
        else:  # CP-style chunks of documents at random positions
            units = []
            for _ in range(rng.randint(2, 24)):
                doc = int(math.exp(rng.uniform(math.log(256), math.log(262144))))
                c = rng.choice([256, 512, 1024, 2048, 4096, 8192]) if fit else off_grid(rng, 100, 9000, [])
                q = min(c, doc)
                units.append((q, rng.randint(q, doc)))
        if w >= max(kv for _, kv in units):  # the window must cut something
            continue
        f = 4.0 * d * h * sum(window_pairs(q, kv, w) for q, kv in units)
        kvtok = sum(kv for _, kv in units)
        if f > 2.5e13 or kvtok * (h // g) * d > 2**31 or sum(q for q, _ in units) * h * d > 2**31:
            continue
        out.append((units, h, g, d, w))
    return out


class WindowLaunch(Launch):
    def __init__(self, units, h, g, d, seed, w):
        super().__init__(units, h, g, d, seed)
        self.kw = window_kw(w)

    def flash_fwd(self):
        return torch.ops.aten._flash_attention_forward(self.q, self.k, self.v, self.cq, self.ck, self.mq, self.mk,
                                                       0.0, True, False, **self.kw)

    def flash_bwd_fn(self):
        o, lse, seed, off, _ = self.flash_fwd()
        return lambda: torch.ops.aten._flash_attention_backward(
            self.do, self.q, self.k, self.v, o, lse, self.cq, self.ck, self.mq, self.mk, 0.0, True, seed, off, **self.kw)


def check_window():
    """The window is applied: a one-key window returns each query's own V."""
    L = WindowLaunch([(300, 300), (128, 200)], 8, 4, 128, 5, 1)
    o = L.flash_fwd()[0].float()
    want = torch.cat([L.v[:300], L.v[300 + 72:]]).repeat_interleave(4, dim=1).float()
    err = ((o - want).norm() / want.norm()).item()
    log(f"window check: rel err {err:.2e}")
    assert err < 1e-2, err


def floor(tag):
    x = torch.ones(1, device="cuda")
    L = WindowLaunch([(64, 64)], 1, 1, 128, 3, 32)
    Lc = Launch([(64, 64)], 1, 1, 128, 3)
    r = {"add_ms": timed(lambda: x.add_(1.0)), "flash_fwd_ms": timed(Lc.flash_fwd),
         "flash_bwd_ms": timed(Lc.flash_bwd_fn()), "window_fwd_ms": timed(L.flash_fwd)}
    log(f"floor {tag}: " + ", ".join(f"{k} {v[0]:.4f}" for k, v in r.items()))
    return r


def main():
    set_name, seed, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    budget = float(sys.argv[4]) if len(sys.argv) > 4 else 120.0
    assert set_name in ("fit", "check")
    os.makedirs(out_dir, exist_ok=True)
    log(f"window set {set_name} seed {seed}; torch {torch.__version__}, {torch.cuda.get_device_name()}; budget {budget} s")
    check_window()
    floors = {"before": floor("before")}
    rng = random.Random(seed)
    launches = design(set_name, rng, 400)
    path = os.path.join(out_dir, f"window_{set_name}.csv")
    t0 = time.time()
    with open(path, "w") as f:
        f.write("#skewsim-measurements,v2\n" + HEADER + ",mask\n")
        for i, (units, h, g, d, w) in enumerate(launches):
            if time.time() - t0 > budget:
                log(f"window budget reached after {i} of {len(launches)} launches")
                break
            name = f"w{set_name}{i:04d}_g{g}"
            try:
                L = WindowLaunch(units, h, g, d, seed * 100003 + i, w)
                for pas, fn in (("fwd", L.flash_fwd), ("bwd", L.flash_bwd_fn())):
                    ms, p10, p90 = timed(fn)
                    tiles = sum((q + 127) // 128 for q, _ in units)
                    fl = 4.0 * d * h * sum(window_pairs(q, kv, w) for q, kv in units)
                    f.write(f"attn,{pas},{name},{seed},torch-flash,0,0,0,0,0,{len(units)},{len(units)},{tiles},{h},"
                            f"{h // g},{d},{sum(q for q, _ in units)},{fl:.4e},0,,{ms:.5f},{p10:.5f},{p90:.5f},"
                            f"{segs_text(units)},sliding:{w}\n")
                f.flush()
                del L
            except Exception as ex:
                log(f"launch {name} failed: {type(ex).__name__}: {str(ex)[:200]}")
                torch.cuda.empty_cache()
            if (i + 1) % 25 == 0:
                log(f"window {i + 1}")
    floors["after"] = floor("after")
    json.dump(floors, open(os.path.join(out_dir, f"floor_{set_name}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
