"""Makes the small PyTorch-profiler Chrome trace committed under traces/.

Runs scaled_dot_product_attention (FlashAttention backend, causal, bf16, head_dim 128) on a few
document shapes under torch.profiler with record_shapes=True and exports a Chrome trace. The
Rust importer (validate::trace) reads the flash kernels, their durations and the launching
operator's input shapes from it.

usage: python3 torch_profile_trace.py OUT.json
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

SHAPES = [(8, 8, 512), (2, 8, 4096), (1, 32, 8192)]  # (batch, heads, doc_len)
ITERS = 3


def main():
    g = torch.Generator(device="cuda").manual_seed(7)
    inputs = []
    for b, h, l in SHAPES:
        inputs.append(
            [torch.rand(b, h, l, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]
        )
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for q, k, v in inputs:  # warm-up outside the profile
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for q, k, v in inputs:
                for _ in range(ITERS):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.cuda.synchronize()
    prof.export_chrome_trace(sys.argv[1])
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="cuda_time_total", row_limit=8))


if __name__ == "__main__":
    main()
