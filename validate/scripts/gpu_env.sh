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
