#!/bin/bash
# One H200: `skewsim validate` (forward + backward) on the plans of
# scripts/make_plans3.sh in .carry-gpu/plans3/, and the NCCL path on one GPU
# (`--transport nccl`: a one-rank communicator, each chunk's pieces sent to itself).
# From the repository root; files under $OUT: env.txt, measurements.csv (all plans),
# validate.log, nccl.csv, nccl.log.
# Usage: validate_plans3.sh ["PLAN_GLOB ..."] ["NCCL_PLAN_GLOB ..."]   (env: WARMUP, REPS)
set -u
B=./.carry-gpu/skewsim
P=${PLANS:-./.carry-gpu/plans3}
GLOB=${1:-p*_*.json}
NGLOB=${2:-p6_*.json}
WARMUP=${WARMUP:-2}
REPS=${REPS:-7}
. "$(dirname "$0")/gpu_env.sh"
n=$NCCL_LIB
(nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; \
 echo "nccl: $n"; echo "WARMUP=$WARMUP REPS=$REPS"; date -u) > $OUT/env.txt 2>&1
cat $OUT/env.txt
first=1
for f in $(for g in $GLOB; do ls $P/$g 2>/dev/null; done); do
  b=$(basename $f .json); s=${b#p}; seed=${s%%_*}; M=${b##*_M}
  echo "== $b (seed $seed, M $M)"
  $B validate --plan $f --seed $seed --chunks $M --warmup $WARMUP --reps $REPS -o /tmp/$b.csv 2>&1 | tee -a $OUT/validate.log
  [ -f /tmp/$b.csv ] || continue
  if [ $first = 1 ]; then cat /tmp/$b.csv > $OUT/measurements.csv; first=0
  else tail -n +3 /tmp/$b.csv >> $OUT/measurements.csv; fi
done
for f in $(for g in $NGLOB; do ls $P/$g 2>/dev/null; done); do
  b=$(basename $f .json); s=${b#p}; seed=${s%%_*}; M=${b##*_M}
  echo "== NCCL on one GPU: $b"
  $B validate --plan $f --seed $seed --chunks $M --warmup $WARMUP --reps $REPS --transport nccl -o $OUT/nccl.csv 2>&1 | tee -a $OUT/nccl.log
done
date -u >> $OUT/env.txt
