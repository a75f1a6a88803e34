//! `validate`: skewsim's bridge to real GPUs (issue 7).
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
//! Everything except [`gpu`] is plain CPU code and is tested on machines without a GPU; [`gpu`]
//! returns [`Error::NoDriver`] there instead of panicking.

pub mod bf16;
pub mod error;
pub mod gpu;
pub mod harness;
pub mod reference;
pub mod stats;
pub mod trace;
pub mod units;

pub use error::Error;
