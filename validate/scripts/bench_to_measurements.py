#!/usr/bin/env python3
"""Write single-launch benchmark CSVs of skewsim-validate (`validate/results/run10_*`, `run12_*`, `run16/`) as
measurement rows (format v2) that `skewsim calibrate` can fit or score, one plan per launch.

  bench_to_measurements.py grid  IN.csv OUT.csv   # case,kernel,heads,q_len,kv_len,units,flops,median_ms,...
  bench_to_measurements.py docs  IN.csv OUT.csv   # kernel,heads,h_kv,doc_len,total_tokens,head_dim,median_ms,...

Only the kernel validate runs plans with (fwd-v3-*-w4) is kept. A grid row is `units`
segments of q_len queries ending at kv_len; a docs row is total_tokens / doc_len whole
documents. The segment histogram is the `segs` column (q:kv*n)."""
import csv, sys

HEADER = ("kind,pass,plan,seed,scheme,step,ga,pool,worker,chunk,units,segments,tiles,heads,"
          "head_dim,q_tokens,flops,bytes,predicted_ms,measured_ms,p10_ms,p90_ms,segs")

def row(plan, heads, head_dim, q, kv, n, flops, ms):
    tiles = n * -(-q // 128)
    return (f"attn,fwd,{plan},99,bench,0,0,0,0,0,{n},{n},{tiles},{heads},{head_dim},{q * n},"
            f"{flops},0,,{ms},{ms},{ms},{q}:{kv}*{n}")

def main():
    kind, src, dst = sys.argv[1:4]
    out = ["#skewsim-measurements,v2", HEADER]
    for r in csv.DictReader(open(src)):
        if not (r["kernel"].startswith("fwd-v3-") and r["kernel"].endswith("-w4")):
            continue
        if kind == "grid":
            q, kv, n = int(r["q_len"]), int(r["kv_len"]), int(r["units"])
            out.append(row(f"grid_{r['case']}", int(r["heads"]), 128, q, kv, n, r["flops"], r["median_ms"]))
        else:
            l, n, d = int(r["doc_len"]), int(r["total_tokens"]) // int(r["doc_len"]), int(r["head_dim"])
            h = int(r["heads"])
            flops = 4.0 * d * h * n * l * (l + 1) / 2
            out.append(row(f"docs_d{d}_kv{r['h_kv']}_l{l}", h, d, l, l, n, f"{flops:.4e}", r["median_ms"]))
    open(dst, "w").write("\n".join(out) + "\n")

main()
