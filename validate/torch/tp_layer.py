"""One llama3-8b layer under tensor parallelism with sequence parallelism (Megatron's layout),
forward and backward, one process per GPU.

usage: torchrun --nproc_per_node TP tp_layer.py OUT.json [TOKENS] [SEQ_LEN] [OFFSET]
  (defaults 32768 tokens packed from traces/wlbllm.json into 32768-token sequences, from
  document OFFSET = 2000: the TP 1 layer of torch_grid.py, so TP = 1 reproduces it)

TP = the world size (1, 2, 4 or 8: it divides 32 query and 8 KV heads). Per rank: the
sequence-parallel input (TOKENS / TP rows), RMSNorm, all-gather along the sequence, the
column-parallel QKV projection (its 32/TP query and 8/TP KV heads), RoPE, varlen
FlashAttention over the documents, the row-parallel output projection, reduce-scatter along
the sequence, residual; the same for the SwiGLU MLP (gate/up column-parallel, down
row-parallel). The collectives' backward is the other one (all-gather <-> reduce-scatter).
Timing: CUDA events on every rank (torch_grid.timed: batches of back-to-back calls, the GPU queue fed);
written per rank with the slowest rank's median, and the documents, so skewsim can price the
same layer and batch.
Keep NCCL_NVLS_ENABLE=0 on the shared multi-GPU machines.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multigpu import gather, init  # noqa: E402
from torch_grid import FlashVarlen, layer_docs, rope, timed  # noqa: E402


def seq_collective(x, gather_rows):
    """All-gather (gather_rows) or reduce-scatter x along the sequence (dim 0) over the TP group."""
    n = dist.get_world_size()
    rows = x.shape[0] * n if gather_rows else x.shape[0] // n
    out = torch.empty((rows,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    if gather_rows:
        dist.all_gather_into_tensor(out, x.contiguous())
    else:
        dist.reduce_scatter_tensor(out, x.contiguous())
    return out


def seq_function(gather_first):
    """An autograd function: all-gather (gather_first) or reduce-scatter along the sequence,
    the other one in the backward."""

    class SeqCollective(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return seq_collective(x, gather_first)

        @staticmethod
        def backward(ctx, g):
            return seq_collective(g, not gather_first)

    return SeqCollective


GatherSeq, ScatterSeq = seq_function(True), seq_function(False)


def main():
    out_json = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
    seq_len = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
    offset = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    rank, tp = init()
    hid, hq, hkv, hd, inter = 4096, 32, 8, 128, 14336
    if hq % tp or hkv % tp or tokens % tp:
        raise SystemExit(f"TP = {tp}: must divide 32 query heads, 8 KV heads and {tokens} tokens")
    lq, lkv, li, lt = hq // tp, hkv // tp, inter // tp, tokens // tp
    docs = layer_docs(tokens, seq_len, offset)
    gen = torch.Generator(device="cuda").manual_seed(1 + rank)
    p = lambda *s: (torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02).requires_grad_(True)
    wqkv, wo, wgu, wd = p(hid, (lq + 2 * lkv) * hd), p(lq * hd, hid), p(hid, 2 * li), p(li, hid)
    ones = lambda: torch.ones(hid, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    n1, n2 = ones(), ones()
    x = torch.randn(lt, hid, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    pos = torch.cat([torch.arange(d, device="cuda") for d in docs]).float()
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
    ang = pos[:, None] * inv[None, :]
    cos, sin = ang.cos().bfloat16()[:, None, :], ang.sin().bfloat16()[:, None, :]
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(docs)), device="cuda", dtype=torch.int32)
    mx = max(docs)
    dy = torch.randn(lt, hid, device="cuda", dtype=torch.bfloat16, generator=gen)

    def fwd():
        h = GatherSeq.apply(torch.nn.functional.rms_norm(x, (hid,), n1, 1e-5))
        q, k, v = (h @ wqkv).split([lq * hd, lkv * hd, lkv * hd], dim=-1)
        q = rope(q.view(tokens, lq, hd), cos, sin)
        k = rope(k.view(tokens, lkv, hd), cos, sin)
        a = FlashVarlen.apply(q, k, v.reshape(tokens, lkv, hd), cu, mx)
        x2 = x + ScatterSeq.apply(a.reshape(tokens, lq * hd) @ wo)
        h2 = GatherSeq.apply(torch.nn.functional.rms_norm(x2, (hid,), n2, 1e-5))
        g, u = (h2 @ wgu).chunk(2, dim=-1)
        return x2 + ScatterSeq.apply((torch.nn.functional.silu(g) * u) @ wd)

    params = [x, wqkv, wo, wgu, wd, n1, n2]
    fb = lambda: torch.autograd.grad(fwd(), params, dy)
    dist.barrier()
    r_f = timed(lambda: fwd(), target_s=0.5, lo=5, hi=20)
    dist.barrier()
    r_fb = timed(fb, target_s=1.0, lo=5, hi=20)
    per = gather([r_f[0], r_fb[0]])
    if rank == 0:
        res = {"model": "llama3-8b", "tp": tp, "sp": True, "tokens": tokens, "seq_len": seq_len,
               "trace": "traces/wlbllm.json", "trace_offset": offset, "docs": docs,
               "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "fwd_ms_per_rank": [r[0] for r in per], "fwd_bwd_ms_per_rank": [r[1] for r in per],
               "fwd_ms": max(r[0] for r in per), "fwd_bwd_ms": max(r[1] for r in per),
               "rank0_fwd_ms_p10_p90": r_f[1:], "rank0_fwd_bwd_ms_p10_p90": r_fb[1:]}
        json.dump(res, open(out_json, "w"), indent=1)
        print(f"TP {tp} SP, {tokens} tokens, {len(docs)} documents: fwd {res['fwd_ms']:.3f} ms, "
              f"fwd+bwd {res['fwd_bwd_ms']:.3f} ms (slowest rank)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
