#!/usr/bin/env bash
# One device call on one H200 (see BENCHMARKS.md, "Attention placement and GEMM clocks: a
# fresh held-out set"): a held-out set the default models were never fitted or selected on,
# from the repository root:
#   bash validate/scripts/heldout_run.sh OUT
# A held-out seed is drawn here and printed. Runs, with the GPU's clocks and power logged
# every 100 ms beside them: the attention (varlen flash) and GEMM held-out grids
# (torch_grid.py check SEED), the fit set's four llama3-8b layer batches (fixed, weights
# seed 71) and the held-out batches SEED draws. Everything lands in $OUT/heldout_run.tgz,
# the log in $OUT/log.txt.
set -u
OUT=$1
T=$(cd "$(dirname "$0")/../torch" && pwd)
. "$(dirname "$0")/gpu_env.sh"
SC=$(python3 -c 'import random; print(random.SystemRandom().randrange(1000, 100000))')
W=/tmp/heldout_run
mkdir -p $W
export PYTHONUNBUFFERED=1
gpu_log $W
echo "held-out seed $SC" >>$W/env.txt
{
  cat $W/env.txt
  echo "== attention and GEMM held-out grids"
  python3 $T/torch_grid.py check $SC $W attn,gemm ${CHECK_BUDGET:-90}
  echo "== layers"
  python3 $T/torch_grid.py fit 71 $W layer
  python3 $T/torch_grid.py check $SC $W layer
  date -u
} 2>&1 | tee $W/log.txt
kill $SMI
tar czf $OUT/heldout_run.tgz -C $W .
cp $W/log.txt $OUT/log.txt
