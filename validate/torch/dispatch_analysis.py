"""What `dispatch_probe.py`'s blocks show about the H200's block dispatcher (no GPU needed).

Usage: python3 dispatch_analysis.py validate/results/dispatch_probe

Prints, from `probe_blocks.csv.gz` and `flash_launch_times.csv`:
- uniform grids: distinct SMs among the first 132 blocks, and whether block → SM is the
  same on every repeat;
- long blocks among empty ones: how many long blocks shared an SM with another long block
  (overlapping for over half their time) on each repeat, against the same count under
  `cost::blocks::Placement::AnyFreeSlot` (first block of every SM one per SM, every later
  block to a free slot at random) over 200 seeded draws;
- replayed flash launches and PyTorch's own launches of the same shapes: how many change
  time by more than 15 % from launch to launch.
"""

import collections
import csv
import gzip
import os
import random
import sys

SMS, PER_SM = 132, 2


def load(path):
    runs = collections.OrderedDict()
    with gzip.open(path, "rt") as f:
        r = csv.reader(f)
        next(r)
        for exp, case, mode, rep, _gx, _gy, _gz, b, w, sm, t0, t1 in r:
            runs.setdefault((exp, case, mode, int(rep)), []).append(
                (int(b), int(w), int(sm), int(t0), int(t1)))
    return runs


def shared(blocks, min_work=1):
    """Long blocks (work >= min_work) that overlapped another long block on their SM for
    over half their time."""
    by_sm = collections.defaultdict(list)
    for b, w, sm, t0, t1 in blocks:
        if w >= min_work:
            by_sm[sm].append((t0, t1, b))
    n = 0
    for blocks_on in by_sm.values():
        for a0, a1, b in blocks_on:
            ov = sum(max(0, min(a1, c1) - max(a0, c0)) for c0, c1, c in blocks_on if c != b)
            n += ov > 0.5 * (a1 - a0)
    return n


def any_free_slot(long_at, seed):
    """Long blocks sharing an SM when the first block of every SM goes one per SM and every
    later one to a free slot at random (empty blocks free their slot at once)."""
    rng = random.Random(seed)
    occ = [[0] * PER_SM for _ in range(SMS)]
    longs = [0] * SMS
    second = [(s, k) for k in range(1, PER_SM) for s in range(SMS)]
    rng.shuffle(second)
    pos = 0

    def put(s, k):
        nonlocal pos
        occ[s][k] = long_at[pos]
        longs[s] += long_at[pos]
        pos += 1

    for s, k in [(s, 0) for s in range(SMS)] + second:
        if pos < len(long_at):
            put(s, k)
    while pos < len(long_at):
        freed = [(s, k) for s in range(SMS) for k in range(PER_SM) if not occ[s][k]]
        rng.shuffle(freed)
        for s, k in freed:
            if pos >= len(long_at):
                break
            put(s, k)
    return sum(c for c in longs if c > 1)


def main():
    d = sys.argv[1]
    runs = load(os.path.join(d, "probe_blocks.csv.gz"))
    print("uniform grids of equal long blocks: distinct SMs among blocks 0..131; block -> SM")
    maps = collections.defaultdict(list)
    for (exp, case, mode, rep), blocks in runs.items():
        if exp == "uniform":
            sm = [b[2] for b in sorted(blocks)]
            maps[case].append((mode, len(set(sm[:SMS])), tuple(sm)))
    for case, l in maps.items():
        distinct = sorted({x[1] for x in l})
        same = len({x[2] for x in l})
        print(f"  {case:>11}: distinct {distinct}, {same} different maps in {len(l)} launches")
    print("\nlong blocks among empty ones: long blocks sharing an SM, per launch (cold, fed)")
    print("  against any-free-slot draws: p10 / median / p90 (mean)")
    counts = collections.defaultdict(list)
    works = {}
    for (exp, case, mode, rep), blocks in runs.items():
        if exp == "pattern":
            counts[case].append(shared(blocks))
            works[case] = [1 if b[1] > 0 else 0 for b in sorted(blocks)]
    for case, c in counts.items():
        sim = sorted(any_free_slot(works[case], s) for s in range(200))
        print(f"  {case:>20}: measured {c} (mean {sum(c) / len(c):.1f}); draws "
              f"{sim[20]} / {sim[100]} / {sim[180]} ({sum(sim) / len(sim):.1f})")
    print("\nreplayed flash launches (probe) and PyTorch's flash forward of the same shapes:")
    ratio = collections.defaultdict(list)
    for (exp, case, mode, rep), blocks in runs.items():
        if exp == "replay":
            t = max(b[4] for b in blocks) - min(b[3] for b in blocks)
            ratio[case].append(t)
    var_probe = sum(1 for t in ratio.values() if max(t) > 1.15 * min(t))
    with open(os.path.join(d, "flash_launch_times.csv")) as f:
        flash = {r["case"]: [float(x) for x in r["launch_ms"].split()] for r in csv.DictReader(f)}
    var_flash = sum(1 for t in flash.values() if max(t) > 1.15 * min(t))
    both = sum(1 for c, t in flash.items()
               if max(t) > 1.15 * min(t) and c in ratio and max(ratio[c]) > 1.15 * min(ratio[c]))
    print(f"  probe: {var_probe} of {len(ratio)} launch shapes vary > 15 % between repeats")
    print(f"  flash: {var_flash} of {len(flash)} vary > 15 % between 8 back-to-back launches;"
          f" {both} of those vary in the probe too")
    for c in ("fit0081_g1", "fit0075_g1", "check0124_g1", "check0001_g1"):
        if c in flash and c in ratio:
            print(f"  {c}: flash ms {' '.join(f'{t:.2f}' for t in flash[c])}; probe ms "
                  f"{' '.join(f'{t / 1e6:.2f}' for t in ratio[c])}")


if __name__ == "__main__":
    main()
