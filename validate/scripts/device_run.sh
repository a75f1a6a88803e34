#!/bin/bash
# One device run of the kernel validation's GPU work; steps: check bench jitter torch bwd mixed gqa d64 grid jitterlong jitter2gpu trace (run from the repository root on the H200 machine, with the
# binary and this script carried in .carry-gpu/). Everything is logged under $OUT.
set -u
B=./.carry-gpu/skewsim-validate
S=./.carry-gpu
export PYTHONUNBUFFERED=1
V=${VARIANTS:-v3w4,v3w8}   # forward kernel variants (v1w4, v1w8, v2w4, v2w8 also exist)
L=/tmp/logs; mkdir -p $L              # logs that duplicate CSVs stay there ($OUT keeps <= 8 files)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d $d ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$d
done
if ! ldconfig -p | grep -q libnvrtc.so; then
  n=$(find / -name 'libnvrtc.so*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [ -n "$n" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(dirname $n)
fi
echo "== env"; (nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw --format=csv; nvidia-smi | head -12; date -u) 2>&1 | tee $OUT/env.txt
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
for step in "$@"; do
  case $step in
    check) echo "== check"; $B check --variants $V 2>&1 | tee $OUT/check.txt ;;
    bench) echo "== bench"; $B bench --variants $V --csv $OUT/ours.csv 2>&1 | tee $L/bench.txt ;;
    jitter) echo "== jitter"; $B jitter --variant ${JVARIANT:-v3w4} --heads 32,2 --doc-len 512,4096 --reps 200 --csv $OUT/jitter_raw.csv 2>&1 | tee $OUT/jitter.txt ;;
    torch) echo "== torch"; python3 $S/torch_bench.py fwd $OUT/torch.csv $OUT/ours.csv 2>&1 | tee $L/torch.txt ;;
    bwd) echo "== bwd"; ($B bench-bwd --csv $OUT/ours_bwd.csv && python3 $S/torch_bench.py bwd $OUT/torch_bwd.csv $OUT/ours_bwd.csv) 2>&1 | tee $L/bwd.txt ;;
    mixed) echo "== mixed"; mkdir -p /tmp/units; ($B bench-mixed --variants $V --corpus $S/wlbllm.json --units-dir /tmp/units --csv $OUT/ours_mixed.csv && python3 $S/torch_bench.py mixed $OUT/torch_mixed.csv $OUT/ours_mixed.csv /tmp/units) 2>&1 | tee $L/mixed.txt ;;
    jitterlong) echo "== jitterlong"
      Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
      nvidia-smi --query-gpu=$Q --format=csv >/dev/null 2>&1 || Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
      nvidia-smi --query-gpu=$Q --format=csv -lms 100 > $OUT/clocks.csv & SMI=$!
      $B jitter --variant v2w8 --heads 32 --doc-len 4096 --reps 1000 --csv $OUT/jitter_raw.csv 2>&1 | tee $OUT/jitter.txt
      $B jitter --variant v2w4 --heads 32,2 --doc-len 512,4096 --reps 500 --csv $OUT/jitter_raw2.csv 2>&1 | tee -a $OUT/jitter.txt
      kill $SMI ;;
    gqa) echo "== gqa (h_q 32, h_kv 8)"; ($B bench --variants $V --heads 32 --kv-div 4 --docs 512,4096,16384 --csv $OUT/ours_gqa.csv && HEADS=32 DOCS=512,4096,16384 KV_DIV=4 python3 $S/torch_bench.py gqa $OUT/torch_gqa.csv $OUT/ours_gqa.csv) 2>&1 | tee $L/gqa.txt ;;
    d64) echo "== head_dim 64"; ($B bench --variants $V --heads 32 --head-dim 64 --docs 512,4096,16384 --csv $OUT/ours_d64.csv && HEADS=32 DOCS=512,4096,16384 HEAD_DIM=64 python3 $S/torch_bench.py fwd $OUT/torch_d64.csv $OUT/ours_d64.csv) 2>&1 | tee $L/d64.txt ;;
    jitter2gpu) echo "== jitter on every GPU at once (cross-GPU spread)"
      nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $OUT/clocks.csv & SMI=$!
      n=$(nvidia-smi -L | wc -l)
      for d in $(seq 0 $((n-1))); do
        $B jitter --device $d --variant ${JVARIANT:-v3w4} --heads 32,2 --doc-len 512,4096 --reps 300 --seed 11 --csv $OUT/jitter_gpu$d.csv > $L/jitter_gpu$d.txt 2>&1 &
      done
      wait $(jobs -p | grep -v "^$SMI$") 2>/dev/null; kill $SMI
      cat $L/jitter_gpu*.txt | tee $OUT/jitter.txt
      (head -1 $OUT/jitter_gpu0.csv; tail -q -n +2 $OUT/jitter_gpu*.csv) > $OUT/jitter_raw.csv && rm $OUT/jitter_gpu*.csv
      $B jitter-fit $OUT/jitter_raw.csv ;;
    grid) echo "== calibration grid"; mkdir -p /tmp/gunits; ($B bench-grid --variant ${JVARIANT:-v3w4} --units-dir /tmp/gunits --csv $OUT/ours_grid.csv && python3 $S/torch_bench.py grid $OUT/torch_grid.csv $OUT/ours_grid.csv /tmp/gunits) 2>&1 | tee $L/grid.txt ;;
    trace) echo "== trace"; python3 $S/torch_profile_trace.py $OUT/flash_trace.json 2>&1 | tail -20; ls -la $OUT/flash_trace.json; $B trace $OUT/flash_trace.json | head -20 ;;
  esac
done
echo "== after"; nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
