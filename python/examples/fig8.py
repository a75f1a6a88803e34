"""Libra Fig. 8 from Python: residual pool imbalance R − 1 of the grouping policies at
GBS = 128, from the committed experiment file, checked against the committed figure.

    pip install ./python
    python python/examples/fig8.py [OUT_DIR]

writes OUT_DIR (default runs/fig8-python) with the same files `skewsim run
experiments/libra-fig8.toml` writes, and prints mean R − 1 per policy and pool size.
"""

import sys
from pathlib import Path

import skewsim

root = Path(__file__).resolve().parents[2]
out = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "runs" / "fig8-python"

run = skewsim.run_files(root / "experiments" / "libra-fig8.toml")
run.write(out)
same = True
for name in ("libra-256k-gbs128.svg", "results.csv"):
    committed = (root / "experiments" / "results" / "libra-fig8" / name).read_text(encoding="utf-8")
    same &= run.files[name] == committed
    print(f"{name}: {'identical to' if run.files[name] == committed else 'DIFFERS from'} the committed file")

rows = run.points()
for corpus in dict.fromkeys(r["corpus"] for r in rows):
    print(f"\n{corpus}: mean R − 1 by pool size P")
    sizes = sorted({r["pool_size"] for r in rows if r["corpus"] == corpus})
    print(f"{'policy':<12}" + "".join(f"{p:>9}" for p in sizes))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        cells = {r["pool_size"]: r["mean_r_minus_1"] for r in rows
                 if r["corpus"] == corpus and r["policy"] == policy}
        print(f"{policy:<12}" + "".join(f"{cells[p]:>9.3f}" for p in sizes))
print(f"\nwrote {out}")
sys.exit(0 if same else 1)
