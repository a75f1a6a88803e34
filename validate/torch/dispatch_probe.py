"""Where the H200's block dispatcher puts thread blocks, measured.

A probe kernel with FlashAttention-2's forward launch resources (128 threads, two blocks
resident per SM) records, per block, the SM it ran on (%smid) and its start and end
(%globaltimer). A block given work runs a loop of independent FMAs (two blocks on one SM
share its issue slots, so they slow each other as the attention kernel's do); a block given
none records and returns at once, as FlashAttention-2's blocks past a segment's end do.

Experiments (each repeated; every launch's blocks written to `probe_blocks.csv.gz`):
- `uniform`: N equal long blocks (132..396): the order SMs are handed blocks in, and whether
  the first 132 land one per SM.
- `pattern`: K long blocks at chosen grid positions among empty ones (first K, every s-th,
  last K): whether a long block joins an SM that already holds one while others are idle.
- `replay`: the grids of measured PyTorch flash forward launches (FlashAttention-2's varlen
  grid: query tiles fastest, then sequences, then heads), each long block given work in
  proportion to its key-loop steps, from the measurement CSVs named on the command line.
- Each `pattern` and `replay` launch runs once after a synchronize and idle GPU (`cold`) and
  in a fed stream of back-to-back launches (`fed`), as the timing protocol runs them.

Usage: python3 dispatch_probe.py OUT_DIR [MEASUREMENTS.csv ...]
"""

import csv
import gzip
import json
import math
import os
import sys
import time


SRC = r"""
extern "C" __global__ void probe(const long long* __restrict__ work,
                                 unsigned long long* __restrict__ rec,
                                 float* __restrict__ sink) {
    extern __shared__ float smem[];
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const long long bid = blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
    const long long w = work[bid];
    if (w > 0) {
        float a0 = threadIdx.x, a1 = a0 + 1.f, a2 = a0 + 2.f, a3 = a0 + 3.f;
        float a4 = a0 + 4.f, a5 = a0 + 5.f, a6 = a0 + 6.f, a7 = a0 + 7.f;
        const float m = 0.999999f, c = 1e-7f;
        for (long long i = 0; i < w; ++i) {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                a0 = fmaf(a0, m, c); a1 = fmaf(a1, m, c); a2 = fmaf(a2, m, c); a3 = fmaf(a3, m, c);
                a4 = fmaf(a4, m, c); a5 = fmaf(a5, m, c); a6 = fmaf(a6, m, c); a7 = fmaf(a7, m, c);
            }
        }
        smem[threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
        __syncthreads();
        if (threadIdx.x == 0) sink[bid] = smem[0] + smem[blockDim.x - 1];
    }
    if (threadIdx.x == 0) {
        unsigned long long t1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        rec[4 * bid + 0] = t0;
        rec[4 * bid + 1] = t1;
        rec[4 * bid + 2] = smid;
        rec[4 * bid + 3] = (unsigned long long)w;
    }
}
"""

THREADS = 128
# Dynamic shared memory per block: two blocks fit the H200's 228 KiB per SM, three do not
# (FlashAttention-2's head_dim-128 forward is held to two by its registers).
SMEM = 100 * 1024
REPS_COLD = 3
REPS_FED = 6


def main():
    import cupy as cp
    import torch

    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    kern = mod.get_function("probe")
    kern.max_dynamic_shared_size_bytes = SMEM
    dev = cp.cuda.Device(0)
    sms = dev.attributes["MultiProcessorCount"]
    try:
        occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.ptr, THREADS, SMEM)
    except Exception as e:  # the API's absence is recorded, the run goes on
        occ = repr(e)
    env = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "device": torch.cuda.get_device_name(0),
        "sms": sms,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cupy": cp.__version__,
        "threads": THREADS,
        "smem_bytes": SMEM,
        "blocks_per_sm_occupancy_api": occ,
        "num_regs": kern.num_regs,
    }
    sink = cp.zeros(1 << 20, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)

    stream.use()  # every copy, fill and launch in one stream, in order

    def launch(grid, work_list, recs=None):
        """Launch the probe over `grid`; `recs` given: one launch per preallocated record
        buffer, back to back (nothing else enqueued between them)."""
        n = len(work_list)
        work = cp.asarray(work_list, dtype=cp.int64)
        if recs is None:
            rec = cp.zeros(4 * n, dtype=cp.uint64)
            kern(grid, (THREADS,), (work, rec, sink), shared_mem=SMEM, stream=stream)
            return rec
        stream.synchronize()
        sleep_gpu(3000)
        for rec in recs:
            kern(grid, (THREADS,), (work, rec, sink), shared_mem=SMEM, stream=stream)
        return recs

    def sleep_gpu(us):
        # A GPU-side sleep ahead of fed launches so the host enqueues them all first.
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
            torch.cuda._sleep(int(us * 1980))

    # Work units: iterations of the FMA loop per microsecond, one block alone.
    rec = launch((1, 1, 1), [20000])
    stream.synchronize()
    rec = launch((1, 1, 1), [20000])
    stream.synchronize()
    r = rec.get()
    it_per_us = 20000 / ((int(r[1]) - int(r[0])) / 1e3)
    env["fma_loop_iters_per_us_alone"] = it_per_us
    # Two blocks on one SM (the occupancy's second slot): the slowdown of sharing.
    rec = launch((2 * sms, 1, 1), [20000] * (2 * sms))
    stream.synchronize()
    r = rec.get().reshape(-1, 4)
    env["fma_loop_us_full_two_per_sm"] = float(sorted((int(a[1]) - int(a[0])) / 1e3 for a in r)[sms])
    print(json.dumps(env), flush=True)

    rows = []

    def record(exp, case, mode, rep, grid, rec):
        r = rec.get().reshape(-1, 4)
        t_min = int(r[:, 0].min())
        for b in range(r.shape[0]):
            rows.append((exp, case, mode, rep, grid[0], grid[1], grid[2], b,
                         int(r[b, 3]), int(r[b, 2]), int(r[b, 0]) - t_min, int(r[b, 1]) - t_min))

    def run_case(exp, case, grid, work, cold=REPS_COLD, fed=REPS_FED):
        for rep in range(cold):
            stream.synchronize()
            time.sleep(0.02)
            rec = launch(grid, work)
            stream.synchronize()
            record(exp, case, "cold", rep, grid, rec)
        if fed:
            recs = [cp.zeros(4 * len(work), dtype=cp.uint64) for _ in range(fed)]
            launch(grid, work, recs)
            stream.synchronize()
            for rep, rec in enumerate(recs):
                record(exp, case, "fed", rep, grid, rec)

    times = []
    try:
        us = lambda t: max(1, int(t * it_per_us))
        # Uniform long blocks: dispatch order and breadth.
        for n in (sms, sms + 1, 200, 2 * sms, 3 * sms):
            run_case("uniform", f"n{n}", (n, 1, 1), [us(200)] * n, cold=3, fed=3)
        # The same as a 3-D grid (x fastest?): 11 x 4 x 6 = 264.
        run_case("uniform", "grid11x4x6", (11, 4, 6), [us(200)] * 264, cold=3, fed=0)
        # Long blocks among empty ones.
        for n, k, where in ((256, 8, "first"), (256, 64, "first"), (256, 132, "first"),
                            (256, 140, "first"), (256, 8, "stride32"), (256, 64, "stride4"),
                            (1000, 9, "stride111"), (1000, 66, "stride15"), (1000, 132, "stride7"),
                            (1000, 200, "stride5"), (256, 8, "last"), (1000, 24, "last"),
                            (4000, 32, "stride125")):
            work = [0] * n
            if where == "first":
                idx = range(k)
            elif where == "last":
                idx = range(n - k, n)
            else:
                s = int(where[6:])
                idx = range(0, s * k, s)
            for i in idx:
                work[i] = us(1000)
            run_case("pattern", f"n{n}_k{k}_{where}", (n, 1, 1), work)
        # Crafted and measured flash launches: replayed by the probe, and timed launch by
        # launch through PyTorch's flash forward (fed, an event between launches).
        cases = [(name, d, h, segs, None) for name, d, h, segs in CRAFTED]
        for path in sys.argv[2:]:
            cases += list(measured_launches(path))
        t_start = time.time()
        for name, d, h, segs, measured in cases:
            grid_work = replay_grid(d, h, segs, it_per_us)
            if grid_work is None:
                continue
            grid, work = grid_work
            run_case("replay", name, grid, work, cold=2, fed=4)
            if time.time() - t_start < FLASH_BUDGET_S:
                times.append((name, d, h, measured, flash_times(torch, d, h, segs)))
    finally:
        write(out, env, rows, times)


def write(out, env, rows, times):
    with open(os.path.join(out, "flash_launch_times.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "head_dim", "heads", "measured_ms", "launch_ms"])
        for name, d, h, measured, ts in times:
            w.writerow([name, d, h, measured, " ".join(f"{t:.5f}" for t in ts)])
    with gzip.open(os.path.join(out, "probe_blocks.csv.gz"), "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["exp", "case", "mode", "rep", "gx", "gy", "gz", "block", "work", "smid",
                    "t0_ns", "t1_ns"])
        w.writerows(rows)
    with open(os.path.join(out, "probe_env.json"), "w") as f:
        json.dump(env, f, indent=1)
    print("rows", len(rows), flush=True)


# Per-block alone time of FlashAttention-2's forward (the refitted block model's form,
# head_dim 128: 362 ns + 1,832 ns per 64-key step, 1,862 ns per masked step), in µs.
BLOCK = {128: (0.362, 1.832, 1.862, 128, 64), 64: (2.110, 2.081, 0.435, 128, 128)}
MAX_BLOCKS = 4096
SCALE = 1.0  # probe time per modelled µs


FLASH_BUDGET_S = 100
FLASH_LAUNCHES = 8
# (name, head_dim, heads, [(q, kv)] per sequence): few long blocks among short ones.
CRAFTED = [
    ("c_k8_of256", 128, 1, [(128, 65536)] * 8 + [(1, 1)] * 248),
    ("c_k66_of256", 128, 1, [(128, 65536)] * 66 + [(1, 1)] * 190),
    ("c_k132_of256", 128, 1, [(128, 65536)] * 132 + [(1, 1)] * 124),
    ("c_k8_stride32", 128, 1, ([(128, 65536)] + [(1, 1)] * 31) * 8),
    ("c_k9_tiles", 128, 1, [(1152, 131072)] + [(100, 200)] * 30),
    ("c_k24_h8", 128, 8, [(384, 65536)] + [(1, 1)] * 40),
]


def measured_launches(path):
    with open(path) as f:
        lines = [l for l in f if not l.startswith("#")]
    for row in csv.DictReader(lines):
        if row["pass"] != "fwd":
            continue
        segs = []
        for part in row["segs"].split(";"):
            qk, n = part.split("*")
            q, k = qk.split(":")
            segs += [(int(q), int(k))] * int(n)
        yield row["plan"], int(row["head_dim"]), int(row["heads"]), segs, row["measured_ms"]


def flash_times(torch, d, heads, segs):
    """ms of each of FLASH_LAUNCHES back-to-back flash forward launches of `segs` (fed
    behind a GPU sleep, an event between launches)."""
    import itertools

    gen = torch.Generator(device="cuda").manual_seed(1)
    nq = sum(q for q, _ in segs)
    nk = sum(k for _, k in segs)
    rnd = lambda n: torch.rand(n, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen) - 0.5
    q, k, v = rnd(nq), rnd(nk), rnd(nk)
    acc = lambda xs: torch.tensor([0] + list(itertools.accumulate(xs)), device="cuda", dtype=torch.int32)
    cq, ck = acc(a for a, _ in segs), acc(b for _, b in segs)
    mq, mk = max(a for a, _ in segs), max(b for _, b in segs)
    fn = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cq, ck, mq, mk, 0.0, True, False)
    fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(FLASH_LAUNCHES + 1)]
    torch.cuda._sleep(int(20e-3 * 1.98e9))
    ev[0].record()
    for i in range(FLASH_LAUNCHES):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) for i in range(FLASH_LAUNCHES)]


def replay_grid(d, heads, segs, it_per_us):
    """FlashAttention-2's varlen forward grid (query tiles, sequences, heads) of `segs` and
    each block's work in FMA-loop iterations (0: a block past its sequence's end)."""
    block, step, diag, bm, bn = BLOCK[d]
    tiles = max(math.ceil(q / bm) for q, _ in segs)
    if tiles * len(segs) * heads > MAX_BLOCKS:
        return None
    one = []
    for q, k in segs:
        for m in range(tiles):
            if m * bm >= q:
                one.append(0)
                continue
            hi = min(k, (m + 1) * bm + k - q)
            n_iter = math.ceil(hi / bn)
            n_diag = n_iter - (m * bm + k - q) // bn
            t = block + n_iter * step + n_diag * diag
            one.append(max(1, int(t * SCALE * it_per_us)))
    long_blocks = sum(1 for w in one if w > 0) * heads
    if long_blocks >= 2 * 132 * 3:
        return None
    return (tiles, len(segs), heads), one * heads


if __name__ == "__main__":
    main()
