#!/usr/bin/env bash
# One device call of the production-kernel measurements on one H200 (see BENCHMARKS.md,
# "Production kernels on one H200"): sliding-window flash launches (window_grid.py) and
# whole llama3-8b layers (torch_grid.py's layer), GPU clocks and power logged beside them.
#   bash validate/scripts/production_run.sh fit 1 OUT      # fitting sets
#   bash validate/scripts/production_run.sh check SEED OUT # held-out sets, another call
# Layer batches: fit = the committed 32K/64K batches, a 16K one and a 32K one under a
# 4,096-key window; check = four batches whose trace offsets and sizes SEED draws.
set -u
PHASE=$1 SEED=$2 OUT=$3 BUDGET=${BUDGET:-110}
T=$(cd "$(dirname "$0")/../torch" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 1000 >"$OUT/smi_$PHASE.csv" &
SMI=$!
{
  python3 "$T/window_grid.py" "$PHASE" "$SEED" "$OUT" "$BUDGET"
  python3 - "$PHASE" "$SEED" "$OUT" "$T" <<'PY'
import random, sys
phase, seed, out, here = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, here)
import torch_grid as g
if phase == "fit":
    configs = [(32768, 32768, 2000, None), (65536, 32768, 50000, None), (16384, 16384, 9000, None),
               (32768, 32768, 2000, 4096)]
else:
    rng = random.Random(seed)
    configs = [(t, s, rng.randrange(0, 200000), w) for t, s, w in
               ((24576, 24576, None), (40960, 20480, None), (49152, 49152, None), (40960, 40960, 2048))]
g.log(f"layer {phase} seed {seed}: {configs}")
g.layer(seed, out, configs, f"layer_{phase}.json")
PY
} 2>&1 | tee "$OUT/log_$PHASE.txt"
kill "$SMI"
