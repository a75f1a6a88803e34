#!/usr/bin/env bash
# One device call on one H200 (see BENCHMARKS.md, "Plans through PyTorch's attention, and one
# llama3-8b layer by part"), from the repository root:
#   bash validate/scripts/layer_run.sh BIN PLANS FIT_SEED CHECK_SEED OUT
# BIN holds the skewsim binary, PLANS the plan files (`skewsim plan`). Runs, with the GPU's
# clocks and power logged every 100 ms beside them:
#  1. `skewsim validate --kernel torch-flash | torch-cudnn | skewsim` on every plan (the first
#     two through validate/torch/sidecar.py), each scored by `calibrate --score-only`;
#  2. the layer's elementwise kernels by kind over token counts (elementwise.py, fit and
#     held-out sets);
#  3. whole llama3-8b layers (torch_grid.py's layer: fit batches, and held-out batches
#     CHECK_SEED draws), each with its GEMMs timed alone.
# Everything lands in $OUT/layer_run.tgz and the log in $OUT/log.txt.
set -u
B=$1/skewsim P=$2 SF=$3 SC=$4 OUT=$5
T=$(cd "$(dirname "$0")/../torch" && pwd)
. "$(dirname "$0")/gpu_env.sh"
W=/tmp/layer_run
mkdir -p $W
export PYTHONUNBUFFERED=1
gpu_log $W
{
  cat $W/env.txt
  for k in torch-flash torch-cudnn skewsim; do
    echo "== validate --kernel $k"
    $B validate --kernel $k --sidecar $T/sidecar.py --plan $P/*.json --seed $SF --warmup 2 --reps 5 -o $W/validate_$k.csv
    if [ -f $W/validate_$k.csv ]; then
      pk=$k; [ $k = torch-cudnn ] && pk=torch-flash
      $B calibrate --score-only --kernel $pk --measurements $W/validate_$k.csv
    fi
  done
  echo "== elementwise"
  python3 $T/elementwise.py fit $SF $W
  python3 $T/elementwise.py check $SC $W
  echo "== layers"
  python3 $T/torch_grid.py fit $SF $W layer,cudnn
  python3 $T/torch_grid.py check $SC $W layer
} 2>&1 | tee $W/log.txt
kill $SMI
tar czf $OUT/layer_run.tgz -C $W .
cp $W/log.txt $OUT/log.txt
