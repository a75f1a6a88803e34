#!/bin/bash
# Plans of the four schemes over three corpora and two L for `skewsim validate`
# (fit on some, score on the others by scheme or corpus). Run here (no GPU); writes
# $1/p<seed>_<scheme>_c<corpus>_L<L>_H<H>_M<M>.json. Seeds are labels (distinct per plan).
set -eu
B=${SKEWSIM:-target/release/skewsim}
D=${1:-.carry-gpu/plans3}
mkdir -p $D
plan() { # seed scheme corpus tag L gbs dp cp pool H M
  local s=$1 sc=$2 c=$3 tag=$4 L=$5 gbs=$6 dp=$7 cp=$8 P=$9 H=${10} M=${11}
  local f=$D/p${s}_${sc}_c${tag}_L$((L/1024))k_H${H}_M${M}.json
  $B plan --scheme $sc --corpus $c --seq-len $L --gbs $gbs --dp $dp --cp $cp --pool-size $P \
    --head-shards $H --chunks $M --seed $s -o $f | tail -1
}
#    seed scheme  corpus      tag  L       gbs dp cp P  H  M
plan 1  libra   libra-256k  256k 262144  4   2  4  2  4  2
plan 2  libra   libra-256k  256k 131072  4   2  4  2  2  2
plan 3  libra   wlbllm      wlb  131072  4   2  4  2  4  4
plan 4  libra   libra-1m    1m   131072  2   2  4  2  1  1
plan 5  ulysses libra-256k  256k 262144  4   2  4  2  4  2
plan 6  ulysses wlbllm      wlb  131072  4   2  4  2  4  1
plan 7  ulysses libra-1m    1m   131072  2   2  4  2  4  2
plan 8  wlbllm  libra-256k  256k 262144  2   2  4  2  1  4
plan 9  wlbllm  wlbllm      wlb  131072  4   2  4  2  1  2
plan 10 wlbllm  libra-1m    1m   131072  2   2  4  2  1  1
plan 11 distca  libra-256k  256k 131072  4   4  1  4  1  4
plan 12 distca  wlbllm      wlb  131072  4   4  1  4  1  2
# Heads per call the other schemes lack (WLB-LLM/DistCA at 2 and 4, Libra/Ulysses at 16).
plan 13 wlbllm  wlbllm      wlb  131072  4   2  4  2  1  16
plan 14 distca  libra-256k  256k 131072  4   4  1  4  1  8
plan 15 libra   wlbllm      wlb  131072  4   2  4  2  2  1
plan 16 ulysses libra-256k  256k 131072  4   2  2  2  2  1
