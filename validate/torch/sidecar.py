"""`skewsim validate --kernel torch-flash|torch-cudnn`'s sidecar: runs a plan's launches through
PyTorch's varlen attention on one GPU and times them as the project's own kernel is timed.

usage: python3 sidecar.py < REQUEST.json   (skewsim starts it; not meant to be run by hand)

Request (one JSON document on stdin, written by `src/cli/validate_torch.rs`):
  {"protocol": 1, "kernel": "torch-flash" | "torch-cudnn", "device": 0, "warmup": W,
   "reps": R, "head_dim": D, "bwd": true|false, "seed": S,
   "launches": [{"heads": H, "kv_heads": G, "units": [[q, kv], ...],
                 "dispatch_bytes": B1, "return_bytes": B2}, ...]}
  A unit is the queries [kv - q, kv) of one sample against its keys [0, kv), causal
  bottom-right: one sequence of the varlen call (cu_seqlens_q / cu_seqlens_k), in the
  order given.

Response (JSON lines on stdout): first {"ready": {torch, cuda, cudnn, gpu, sms}}, then one
{"launch": i, "fwd_ms": [...], "bwd_ms": [...] | null, "dispatch_ms": [...],
"return_ms": [...]} per launch in request order (`fwd_ms` null for a launch without units),
then {"done": n}. On failure one {"error": {"kind": K, "message": M}} and exit status 1;
K is `no-torch` (torch not importable), `no-gpu` (torch sees no CUDA device),
`unsupported` (the kernel cannot run these units on this GPU), `bad-request` or `failed`.

Timing, as the project's kernel (`validate::gpu::Gpu::time_fwd`): `warmup` untimed calls,
a synchronize, then `reps` calls back to back on one stream with a CUDA event recorded
before the first and after each; call i takes event i to event i + 1. The backward is
timed the same way after one forward that writes O and the LSE; the dispatch and return
copies are device-to-device copies of the planned bytes, timed the same way.
"""
import json
import os
import sys

PROTOCOL = 1


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fail(kind, message):
    emit({"error": {"kind": kind, "message": message}})
    sys.exit(1)


def series(torch, fn, warmup, reps):
    """`reps` event-bracketed back-to-back calls after `warmup` untimed ones, ms each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    evs[0].record()
    for i in range(reps):
        fn()
        evs[i + 1].record()
    torch.cuda.synchronize()
    return [evs[i].elapsed_time(evs[i + 1]) for i in range(reps)]


def copy_series(torch, nbytes, warmup, reps):
    if nbytes == 0:
        return [0.0] * reps
    src = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return series(torch, lambda: dst.copy_(src), warmup, reps)


def check_request(req):
    for key in ("kernel", "warmup", "reps", "head_dim", "bwd", "launches"):
        if key not in req:
            fail("bad-request", f"missing field `{key}`")
    if req.get("protocol") != PROTOCOL:
        fail("bad-request", f"protocol {req.get('protocol')!r}: allowed {PROTOCOL}")
    if req["kernel"] not in ("torch-flash", "torch-cudnn"):
        fail("bad-request", f"kernel {req['kernel']!r}: allowed torch-flash or torch-cudnn")
    if req["reps"] < 1 or req["warmup"] < 0:
        fail("bad-request", f"reps {req['reps']}, warmup {req['warmup']}: allowed reps >= 1, warmup >= 0")
    for i, l in enumerate(req["launches"]):
        h, g = l.get("heads", 0), l.get("kv_heads", 0)
        if h < 1 or g < 1 or h % g:
            fail("bad-request", f"launch {i}: heads {h}, kv_heads {g}: allowed kv_heads >= 1 dividing heads")
        for q, kv in l.get("units", []):
            if not 1 <= q <= kv:
                fail("bad-request", f"launch {i}: unit ({q}, {kv}): allowed 1 <= q <= kv")


def cudnn_suffix_ok(Launch):
    """Whether cuDNN's varlen causal attention gives FlashAttention's outputs on units whose
    queries are a suffix of their keys (bottom-right causal), with the largest difference."""
    L = Launch([(128, 1024), (512, 512), (64, 3000)], 4, 2, 128, 7)
    a = L.flash_fwd()[0].float()
    b = L.cudnn_fwd()[0].float()
    err = (a - b).abs().max().item()
    return err < 0.05, err


def main():
    try:
        req = json.load(sys.stdin)
    except ValueError as ex:
        fail("bad-request", f"request is not JSON: {ex}")
    check_request(req)
    try:
        import torch
    except Exception as ex:  # ImportError, or a broken install
        fail("no-torch", f"{type(ex).__name__}: {ex}")
    if not torch.cuda.is_available():
        fail("no-gpu", f"torch {torch.__version__} sees no CUDA GPU")
    dev = req.get("device", 0)
    if not 0 <= dev < torch.cuda.device_count():
        fail("bad-request", f"device {dev}: allowed 0..{torch.cuda.device_count() - 1}")
    torch.cuda.set_device(dev)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_grid import Launch

    kernel, warmup, reps = req["kernel"], req["warmup"], req["reps"]
    d = req["head_dim"]
    emit({"ready": {"torch": torch.__version__, "cuda": torch.version.cuda,
                    "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
                    "sms": torch.cuda.get_device_properties(dev).multi_processor_count}})
    if kernel == "torch-cudnn":
        suffix = sum(1 for l in req["launches"] for q, kv in l.get("units", []) if q < kv)
        try:
            ok, err = cudnn_suffix_ok(Launch)
        except Exception as ex:
            fail("unsupported", f"cuDNN attention does not run varlen on this GPU with torch "
                                f"{torch.__version__}: {type(ex).__name__}: {str(ex)[:300]}")
        if not ok and suffix:
            fail("unsupported", f"cuDNN's varlen causal attention in torch {torch.__version__} "
                                f"(cuDNN {torch.backends.cudnn.version()}) does not align the mask "
                                f"bottom-right (max |cudnn - flash| = {err:.3f} on units whose queries "
                                f"are a suffix of their keys); this plan has {suffix} such units")
    seed = req.get("seed", 0)
    for i, l in enumerate(req["launches"]):
        units = [tuple(u) for u in l.get("units", [])]
        out = {"launch": i, "fwd_ms": None, "bwd_ms": None}
        try:
            if units:
                h, g = l["heads"], l["kv_heads"]
                L = Launch(units, h, h // g, d, seed * 100003 + i)
                fwd = L.flash_fwd if kernel == "torch-flash" else L.cudnn_fwd
                out["fwd_ms"] = series(torch, fwd, warmup, reps)
                o = fwd()[0]
                if not torch.isfinite(o).all().item():
                    fail("failed", f"launch {i}: the forward wrote non-finite outputs")
                if req["bwd"]:
                    bwd = L.flash_bwd_fn() if kernel == "torch-flash" else L.cudnn_bwd_fn()
                    out["bwd_ms"] = series(torch, bwd, warmup, reps)
                    if not all(torch.isfinite(t).all().item() for t in bwd()[:3]):
                        fail("failed", f"launch {i}: the backward wrote non-finite gradients")
                del L
            out["dispatch_ms"] = copy_series(torch, l.get("dispatch_bytes", 0), warmup, reps)
            out["return_ms"] = copy_series(torch, l.get("return_bytes", 0), warmup, reps)
        except torch.cuda.OutOfMemoryError as ex:
            fail("failed", f"launch {i}: out of GPU memory: {str(ex)[:300]}")
        except RuntimeError as ex:
            fail("failed", f"launch {i}: {type(ex).__name__}: {str(ex)[:300]}")
        emit(out)
    emit({"done": len(req["launches"])})


if __name__ == "__main__":
    main()
