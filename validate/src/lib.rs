//! `validate`: skewsim's bridge to real GPUs.
//!
//! Owns the attention kernels (`validate/kernels/*.cu`, compiled at run time by NVRTC through
//! cudarc), their float64 CPU reference, the work-unit layout the kernels consume, timing with
//! CUDA events, the runtime-jitter statistics and the PyTorch-profiler trace importer.
//!
//! It must not depend on the `skewsim` crate (skewsim's future `validate` subcommand depends on
//! this one), so it carries its own small work-unit types: a [`units::WorkUnit`] is the query range
//! `[a, e)` of one sample with that sample's KV prefix `[0, e)` — exactly the units TAP tiles
//! (Libra reading note, /work/shared/papers/000_*) and DistCA shards (002_*) produce.
//!
//! Kernels: forward versions 1–3 (`attn_fwd.cu`, `attn_fwd_v2.cu`, `attn_fwd_v3.cu`; v3 is the
//! fast one, 0.93–0.96 of PyTorch's FlashAttention-2 on an H200 for long documents) and the
//! backward (`attn_bwd.cu`); versions, figures and commands in BENCHMARKS.md, "Validation".
//! The `skewsim-validate` binary drives them (check, bench, bench-bwd, bench-mixed, jitter,
//! trace, compile).
//!
//! Everything except [`gpu`] is plain CPU code and is tested on machines without a GPU; [`gpu`]
//! returns [`Error::NoDriver`] there instead of panicking.

pub mod bf16;
pub mod error;
pub mod gpu;
pub mod harness;
pub mod nccl;
pub mod reference;
pub mod stats;
pub mod trace;
pub mod units;

pub use error::Error;
