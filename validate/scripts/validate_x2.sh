#!/bin/bash
# The NCCL path between two GPUs (nvidia-h200-x2). For a few plans of
# make_plans3.sh (in .carry-gpu/plans4/): `skewsim validate --gpus 2` (worker w on GPU w mod 2,
# each chunk's transfers as NCCL grouped send/recv between the GPUs) beside `--gpus 1`
# (device-to-device copies on GPU 0); then identical launches on both GPUs at once for the
# cross-GPU jitter spread (device_run.sh jitter2gpu). From the repository root, with the
# binaries in .carry-gpu/; files under $OUT: env.txt, x2.csv, x1.csv, validate.log, jitter.txt,
# jitter_raw.csv, clocks.csv.
set -u
B=./.carry-gpu/skewsim
P=./.carry-gpu/plans4
. "$(dirname "$0")/gpu_env.sh"
n=$NCCL_LIB
(nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv; nvidia-smi topo -m; echo "nccl: $n"; date -u) > $OUT/env.txt 2>&1
cat $OUT/env.txt
for g in 2 1; do
  first=1
  for f in $(for p in ${PLANS:-p6_* p2_* p11_* p9_*}; do ls $P/$p.json 2>/dev/null; done); do
    b=$(basename $f .json); s=${b#p}; seed=${s%%_*}; M=${b##*_M}
    echo "== $b on $g GPU(s)"
    $B validate --plan $f --seed $seed --chunks $M --gpus $g --warmup 2 --reps 5 -o /tmp/x${g}_$b.csv 2>&1 | tee -a $OUT/validate.log | tail -25
    [ -f /tmp/x${g}_$b.csv ] || continue
    if [ $first = 1 ]; then cat /tmp/x${g}_$b.csv > $OUT/x$g.csv; first=0
    else tail -n +3 /tmp/x${g}_$b.csv >> $OUT/x$g.csv; fi
  done
done
bash validate/scripts/device_run.sh jitter2gpu
