#!/bin/bash
# Score a calibration fitted on the 16 plans of results/plans_run15 on the 12 fresh plans of
# results/plans_run19 (seeds 31-42, measured on another day's H200 lease), with the block models and with
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
# Single launches never fitted (the run12 grid, the run16 wave grid, the run10 GQA and head_dim-64
# documents; validate/scripts/bench_to_measurements.py), scored against all 28 plans.
G="validate/results/run12_grid_measurements.csv validate/results/run16/waves_measurements.csv validate/results/run10_gqa_measurements.csv validate/results/run10_d64_measurements.csv"
$B calibrate --measurements $R15 $R19 $G --holdout-plans grid_,docs_ -o $O/cal_bench_holdout.json > $O/bench_holdout.txt
$B --json calibrate --measurements $R15 $R19 $G --holdout-plans grid_,docs_ -o $O/cal_bench_holdout.json > $O/bench_holdout.json
# The recommended H200 calibration: every plan of an odd seed plus the run12 grid (which pins
# the call overhead and fixed block time), scored on the plans of even seeds.
E=2,4,6,8,10,12,14,16,32,34,36,38,40,42
$B calibrate --measurements $R15 $R19 validate/results/run12_grid_measurements.csv --holdout-seeds $E -o $O/cal_h200.json > $O/cal_h200.txt
sed -n '/^after calibration/,/^copy/p' $O/fresh_blocks.txt
