#!/bin/bash
# Plan execution: run `skewsim validate` on every plan in .carry-gpu/plans/ (files
# p_s<SEED>_H<H>_M<M>.json, made by `skewsim plan ... --head-shards H --chunks M --seed SEED`)
# on the device machine, from the repository root; one combined measurement CSV and the log
# come back under $OUT.
set -u
B=./.carry-gpu/skewsim
P=./.carry-gpu/plans
REPS=${REPS:-9}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d $d ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$d
done
if ! ldconfig -p | grep -q libnvrtc.so; then
  n=$(find / -name 'libnvrtc.so*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [ -n "$n" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(dirname $n)
fi
(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; date -u) > $OUT/env.txt 2>&1
cat $OUT/env.txt
first=1
for f in $P/p_s*_H*_M*.json; do
  b=$(basename $f .json); s=${b#p_s}; seed=${s%%_*}; M=${b##*_M}
  echo "== $b (seed $seed, M $M)"
  $B validate --plan $f --seed $seed --chunks $M --reps $REPS -o /tmp/$b.csv 2>&1 | tee -a $OUT/validate.log
  [ -f /tmp/$b.csv ] || continue
  if [ $first = 1 ]; then cat /tmp/$b.csv > $OUT/measurements.csv; first=0
  else tail -n +2 /tmp/$b.csv >> $OUT/measurements.csv; fi
done
