#!/usr/bin/env bash
# One device call on one H200 (see BENCHMARKS.md, "Kernel times with the GPU queue fed"):
# the production-kernel grids re-measured under torch_grid.py's `timed` (batches of
# back-to-back calls behind a GPU sleep, so the host's dispatch overlaps the kernels), from
# the repository root:
#   bash validate/scripts/fed_run.sh OUT
# A held-out seed is drawn here and printed. Runs, with the GPU's clocks and power logged
# every 100 ms beside them: attention (varlen flash) and GEMM grids, fit set (seed 1) and
# held-out set; sliding-window launches, fit (seed 1) and held out; elementwise kernels by
# kind, fit (seed 71) and held out. Everything lands in $OUT/fed_run.tgz, the log in
# $OUT/log.txt.
set -u
OUT=$1
T=$(cd "$(dirname "$0")/../torch" && pwd)
. "$(dirname "$0")/gpu_env.sh"
SC=$(python3 -c 'import random; print(random.SystemRandom().randrange(1000, 100000))')
W=/tmp/fed_run
mkdir -p $W/fit $W/check $W/window $W/elementwise
export PYTHONUNBUFFERED=1
gpu_log $W
echo "held-out seed $SC" >>$W/env.txt
{
  cat $W/env.txt
  echo "== attention and GEMM grids"
  python3 $T/torch_grid.py fit 1 $W/fit attn,gemm ${FIT_BUDGET:-120}
  python3 $T/torch_grid.py check $SC $W/check attn,gemm ${CHECK_BUDGET:-70}
  echo "== sliding-window launches"
  python3 $T/window_grid.py fit 1 $W/window ${WINDOW_BUDGET:-30}
  python3 $T/window_grid.py check $SC $W/window ${WINDOW_BUDGET:-30}
  echo "== elementwise"
  python3 $T/elementwise.py fit 71 $W/elementwise
  python3 $T/elementwise.py check $SC $W/elementwise
  date -u
} 2>&1 | tee $W/log.txt
kill $SMI
tar czf $OUT/fed_run.tgz -C $W .
cp $W/log.txt $OUT/log.txt
