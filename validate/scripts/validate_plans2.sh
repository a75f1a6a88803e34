#!/bin/bash
# The NCCL path of `skewsim validate --gpus 2` on one plan (meant for nvidia-h200-x2; runs on
# one H200 too), then two more plans of validate_plans.sh's set, on one GPU. From the repository root; files under $OUT.
set -u
B=./.carry-gpu/skewsim
P=./.carry-gpu/plans
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d $d ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$d
done
# cudarc looks for libnccl.so (not .so.2): link the wheel's library under that name.
n=$(find / -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)
mkdir -p /tmp/ncl && [ -n "$n" ] && ln -sf $n /tmp/ncl/libnccl.so && export LD_LIBRARY_PATH=/tmp/ncl:$LD_LIBRARY_PATH
if ! ldconfig -p | grep -q libnvrtc.so; then
  r=$(find / -name 'libnvrtc.so*' -not -path '/proc/*' 2>/dev/null | head -1)
  [ -n "$r" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(dirname $r)
fi
(nvidia-smi --query-gpu=index,name,driver_version --format=csv; nvidia-smi topo -m; echo "nccl: $n"; date -u) > $OUT/env2.txt 2>&1
cat $OUT/env2.txt
echo "== nccl: p_s9 on 2 GPUs"
$B validate --plan $P/p_s9_H1_M1.json --seed 9 --chunks 1 --gpus 2 --reps 9 -o $OUT/nccl_s9.csv 2>&1 | tee $OUT/validate2.log
for b in p_s9_H1_M1 p_s8_H2_M2; do
  s=${b#p_s}; seed=${s%%_*}; M=${b##*_M}
  echo "== $b (1 GPU)"
  $B validate --plan $P/$b.json --seed $seed --chunks $M --reps 9 -o $OUT/m_$b.csv 2>&1 | tee -a $OUT/validate2.log
done
