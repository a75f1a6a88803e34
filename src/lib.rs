//! skewsim: a deterministic discrete-event simulator of attention-workload skew in
//! long-context LLM training, and of the four schemes that fight it (DeepSpeed Ulysses,
//! WLB-LLM, DistCA, Libra).
//!
//! The library is the pure core: it does no file, network or device I/O (the `skewsim`
//! binary and `report` are the edges). See `ARCHITECTURE.md` for the code map and the
//! invariants every module keeps.

pub mod balance;
pub mod cluster;
pub mod cost;
pub mod engine;
pub mod error;
pub mod experiment;
pub mod net;
pub mod plan;
pub mod report;
pub mod rng;
pub mod schedule;
pub mod theory;
pub mod workload;

pub use error::{Error, Result};
