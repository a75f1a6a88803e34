"""Sliding-window forward launches of PyTorch's varlen FlashAttention on one GPU.

A held-out set (seeded): documents of a lognormal length mix packed into launches of T tokens,
heads 8 or 32 (head_dim 128, GQA 4:1), each launch timed causal and under sliding windows
W (window_size_left = W - 1, window_size_right = 0), CUDA events, one untimed call, the
median of the timed ones. Writes CSV: mask,heads,head_dim,tokens,docs,median_ms
(docs: ';'-joined lengths), which `skewsim`'s mask scoring test reads.

usage: python3 torch_window.py OUT.csv [seed]
"""
import csv
import random
import statistics
import sys

import torch

D = 128
REPS = 9


def docs_of(rng, total):
    out = []
    left = total
    while left > 0:
        n = min(left, max(16, int(rng.lognormvariate(7.5, 1.4))))
        out.append(n)
        left -= n
    rng.shuffle(out)
    return out


def launch(docs, h, window):
    t = sum(docs)
    g = torch.Generator(device="cuda").manual_seed(len(docs) * 7919 + h)
    q = torch.randn(t, h, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(t, h // 4, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(t, h // 4, D, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = [0]
    for n in docs:
        cu.append(cu[-1] + n)
    cu = torch.tensor(cu, device="cuda", dtype=torch.int32)
    mx = max(docs)
    kw = {} if window is None else {"window_size_left": window - 1, "window_size_right": 0}

    def run():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, True, False, **kw)

    out = run()[0]
    assert torch.isfinite(out).all()
    times = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def check_window():
    """The window is applied: a 1-key window returns V of the query's own token."""
    h, docs = 8, [300, 200]
    t = sum(docs)
    q = torch.randn(t, h, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, h // 4, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(t, h // 4, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 300, 500], device="cuda", dtype=torch.int32)
    o = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 300, 300, 0.0, True, False,
                                                window_size_left=0, window_size_right=0)[0]
    want = v.repeat_interleave(4, dim=1)
    err = ((o.float() - want.float()).norm() / want.float().norm()).item()
    print(f"window check: rel err {err:.2e}", flush=True)
    assert err < 1e-2


def main():
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 19
    rng = random.Random(seed)
    check_window()
    rows = []
    for total in [16384, 65536, 262144]:
        for h in [8, 32]:
            for mix in range(2):
                docs = docs_of(rng, total)
                for w in [None, 512, 2048, 8192, 32768]:
                    if w is not None and w >= max(docs):
                        continue
                    ms = launch(docs, h, w)
                    mask = "causal" if w is None else f"sliding:{w}"
                    rows.append([mask, h, D, total, ";".join(map(str, docs)), f"{ms:.5f}"])
                    print(f"{mask:>14} h={h:2d} T={total:6d} docs={len(docs):4d} max={max(docs):6d} {ms:9.4f} ms", flush=True)
    with open(out, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["mask", "heads", "head_dim", "tokens", "docs", "median_ms"])
        wr.writerows(rows)


if __name__ == "__main__":
    main()
