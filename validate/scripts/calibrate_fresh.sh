#!/bin/bash
# Issue 7, run 19: score a calibration fitted on run 15's 16 plans on the 12 fresh plans of
# run 19 (seeds 31-42, measured on another day's H200 lease), with the block models and with
# the tables alone; then the default split (every second seed) over all 28 plans. No GPU.
# Usage: calibrate_fresh.sh [OUTDIR]   (default validate/results/plans_run19)
set -eu
B=${SKEWSIM:-target/release/skewsim}
O=${1:-validate/results/plans_run19}
R15=validate/results/plans_run15/measurements.csv
R19=validate/results/plans_run19/measurements.csv
S=31,32,33,34,35,36,37,38,39,40,41,42
for km in blocks table; do
  $B calibrate --measurements $R15 $R19 --holdout-seeds $S --kernel-model $km -o $O/cal_fresh_$km.json > $O/fresh_$km.txt
  $B --json calibrate --measurements $R15 $R19 --holdout-seeds $S --kernel-model $km -o $O/cal_fresh_$km.json > $O/fresh_$km.json
  $B calibrate --measurements $R15 $R19 --kernel-model $km -o $O/cal_all28_$km.json > $O/all28_$km.txt
done
sed -n '/^after calibration/,/^copy/p' $O/fresh_blocks.txt
