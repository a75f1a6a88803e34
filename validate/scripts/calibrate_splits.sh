#!/bin/bash
# Fit on some plans, score on the others, split by scheme, by corpus and by L
# (no GPU). Usage: calibrate_splits.sh MEASUREMENTS.csv OUTDIR [EXTRA calibrate flags, e.g. --exclude-plans p13_]
set -eu
B=${SKEWSIM:-target/release/skewsim}
M=$1; O=$2; shift 2; EXTRA=("$@"); mkdir -p $O
split() { # name, calibrate flags...
  local n=$1; shift
  echo "=== split $n: $*"
  $B calibrate --measurements $M "$@" ${EXTRA[@]+"${EXTRA[@]}"} -o $O/cal_$n.json > $O/split_$n.txt
  $B --json calibrate --measurements $M "$@" ${EXTRA[@]+"${EXTRA[@]}"} -o $O/cal_$n.json > ${JSON_DIR:-$O}/split_$n.json
  sed -n '/^after calibration/,/^copy/p' $O/split_$n.txt
}
split by-scheme-A --holdout-schemes wlbllm,distca      # fit Libra + Ulysses
split by-scheme-B --holdout-schemes libra,ulysses      # fit WLB-LLM + DistCA
for s in libra ulysses wlbllm distca; do split loso-$s --holdout-schemes $s; done
split by-corpus-wlb --holdout-plans _cwlb_             # fit libra-256k + libra-1m corpora
split by-corpus-1m --holdout-plans _c1m_
split by-L-256k --holdout-plans _L256k_                # fit L = 128K only
split by-seed --holdout-seeds 2,4,6,8,10,12,14,16   # every second plan
