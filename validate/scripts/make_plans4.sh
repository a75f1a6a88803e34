#!/bin/bash
# Fresh plans for a held-out check of a calibration fitted on make_plans3.sh's plans (seeds
# 31-42, never measured before), at heads per call 1-32 (1 head per call was never fitted),
# L 128K / 256K, the four schemes and three corpora. Run here (no GPU); writes
# $1/p<seed>_<scheme>_c<corpus>_L<L>_H<H>_M<M>.json (heads per call = 32 / (H * M)).
set -eu
B=${SKEWSIM:-target/release/skewsim}
D=${1:-.carry-gpu/plans4}
mkdir -p $D
plan() { # seed scheme corpus tag L gbs dp cp pool H M
  local s=$1 sc=$2 c=$3 tag=$4 L=$5 gbs=$6 dp=$7 cp=$8 P=$9 H=${10} M=${11}
  local f=$D/p${s}_${sc}_c${tag}_L$((L/1024))k_H${H}_M${M}.json
  $B plan --scheme $sc --corpus $c --seq-len $L --gbs $gbs --dp $dp --cp $cp --pool-size $P \
    --head-shards $H --chunks $M --seed $s -o $f | tail -1
}
#    seed scheme  corpus      tag  L       gbs dp cp P  H  M
plan 31 libra   libra-256k  256k 131072  4   2  4  2  4  8
plan 32 ulysses wlbllm      wlb  131072  4   2  4  2  4  4
plan 33 wlbllm  libra-1m    1m   262144  2   2  4  2  1  2
plan 34 distca  libra-1m    1m   131072  4   4  1  4  1  1
plan 35 libra   libra-1m    1m   262144  2   2  4  2  2  4
plan 36 ulysses libra-256k  256k 262144  4   2  4  2  4  1
plan 37 distca  wlbllm      wlb  262144  4   4  1  4  1  8
plan 38 wlbllm  wlbllm      wlb  262144  4   2  4  2  1  4
plan 39 libra   wlbllm      wlb  262144  4   2  4  2  1  1
plan 40 distca  libra-256k  256k 262144  4   4  1  4  1  2
plan 41 wlbllm  libra-256k  256k 131072  4   2  4  2  1  32
plan 42 ulysses libra-1m    1m   262144  2   2  4  2  4  2
