# Sourced by the device scripts: NVLink multicast off, and the libraries the `validate` crate
# loads at run time on the path — NVRTC, and NCCL under the name cudarc looks for
# (libnccl.so, not .so.2; $NCCL_LIB names the one found).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d $d ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$d
done
if ! ldconfig -p | grep -q libnvrtc.so; then
  r=$(find / -name 'libnvrtc.so*' -not -path '/proc/*' 2>/dev/null | head -1)
  [ -n "$r" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(dirname $r)
fi
NCCL_LIB=$(find / -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)
mkdir -p /tmp/ncl && [ -n "$NCCL_LIB" ] && ln -sf $NCCL_LIB /tmp/ncl/libnccl.so && export LD_LIBRARY_PATH=/tmp/ncl:$LD_LIBRARY_PATH

# gpu_log W: the GPU, driver, power limit and torch versions into W/env.txt, and the GPU's
# clocks, power and temperature every 100 ms into W/smi.csv in the background ($SMI is its
# pid: `kill $SMI` stops it).
gpu_log() {
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  } >"$1/env.txt" 2>&1
  local q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$q --format=csv >/dev/null 2>&1 || q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
  nvidia-smi --query-gpu=$q --format=csv -lms 100 >"$1/smi.csv" 2>/dev/null &
  SMI=$!
}
