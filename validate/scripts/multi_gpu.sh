#!/bin/bash
# Validation on N GPUs of one host, every step in one command (from the repository root):
#   bash validate/scripts/multi_gpu.sh N OUT_DIR
# 1. plans of the four schemes (made here by `skewsim plan` unless PLANS names a folder of
#    plan JSON) through `skewsim validate --gpus N`: worker w on GPU w mod N, transfers as NCCL
#    grouped send/recv, each worker's time and each exchange's time against the simulator's
#    prediction (validate_gN.csv, validate_gN.log);
# 2. the nccl-tests-style collective sweep, 8 MiB - 8 GiB (collectives_gN.csv), and with N >= 2
#    `skewsim calibrate --collectives` on it (collectives_fit_gN.txt);
# 3. one llama3-8b layer at TP = N with SP, forward and backward (tp_layer_gN.json);
# 4. the same attention kernel on all N GPUs for STEPS = 500 steps (variance_gN.csv), with
#    `skewsim-validate jitter-fit` on it (variance_fit_gN.txt).
# Binaries: SKEWSIM (default target/release/skewsim), SKEWSIM_VALIDATE (default
# target/release/skewsim-validate); scripts from SCRIPTS (default validate); kernel prices
# from CALIBRATION (default calibrations/skewsim-h200.json); STEPS variance steps. NVLink
# multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
N=${1:?usage: multi_gpu.sh N OUT_DIR}
O=${2:?usage: multi_gpu.sh N OUT_DIR}
B=${SKEWSIM:-target/release/skewsim}
V=${SKEWSIM_VALIDATE:-target/release/skewsim-validate}
S=${SCRIPTS:-validate}
STEPS=${STEPS:-500}
CAL=${CALIBRATION:-calibrations/skewsim-h200.json}   # prices the project's kernels
export PYTHONUNBUFFERED=1
mkdir -p "$O"
. "$(dirname "$0")/gpu_env.sh"
(nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv; nvidia-smi topo -m; echo "nccl: $NCCL_LIB"; date -u) > "$O/env_g$N.txt" 2>&1

# 1. plans across GPUs
P=${PLANS:-$O/plans}
if [ ! -d "$P" ]; then
  mkdir -p "$P"
  plan() { # seed scheme corpus L gbs dp cp pool H M
    $B plan --scheme $2 --corpus $3 --seq-len $4 --gbs $5 --dp $6 --cp $7 --pool-size $8 \
      --head-shards $9 --chunks ${10} --seed $1 -o "$P/p$1_$2_H$9_M${10}.json" | tail -1
  }
  plan 1 libra   libra-256k 65536 4 2 4 2 4 2
  plan 2 ulysses wlbllm     65536 4 2 4 2 4 1
  plan 3 wlbllm  wlbllm     65536 4 2 4 2 1 2
  plan 4 distca  libra-256k 65536 8 8 1 8 1 4
fi
: > "$O/validate_g$N.log"
first=1
for f in "$P"/*.json; do
  b=$(basename "$f" .json); s=${b#p}; seed=${s%%_*}; M=${b##*_M}
  echo "== $b on $N GPU(s)" | tee -a "$O/validate_g$N.log"
  $B validate --plan "$f" --seed $seed --chunks $M --gpus $N --transport nccl --calibration $CAL --warmup 2 --reps 5 \
    -o /tmp/v_$b.csv 2>&1 | tee -a "$O/validate_g$N.log" | tail -14
  [ -f /tmp/v_$b.csv ] || continue
  if [ $first = 1 ]; then cat /tmp/v_$b.csv > "$O/validate_g$N.csv"; first=0
  else tail -n +3 /tmp/v_$b.csv >> "$O/validate_g$N.csv"; fi
done

# 2. collectives
torchrun --standalone --nproc_per_node $N $S/torch/collectives.py "$O/collectives_g$N.csv" 2>&1 | tail -60
if [ $N -ge 2 ] && [ -f "$O/collectives_g$N.csv" ]; then
  $B calibrate --collectives "$O/collectives_g$N.csv" 2>&1 | tee "$O/collectives_fit_g$N.txt"
fi

# 3. the TP layer
torchrun --standalone --nproc_per_node $N $S/torch/tp_layer.py "$O/tp_layer_g$N.json" 2>&1 | tail -5

# 4. variance between GPUs
torchrun --standalone --nproc_per_node $N $S/torch/variance.py "$O/variance_g$N.csv" $STEPS 2>&1 | tail -3
[ -f "$O/variance_g$N.csv" ] && $V jitter-fit "$O/variance_g$N.csv" 2>&1 | tee "$O/variance_fit_g$N.txt"
