//! skewsim: a deterministic discrete-event simulator of attention-workload skew in
//! long-context LLM training, and of the four schemes that fight it (DeepSpeed Ulysses,
//! WLB-LLM, DistCA, Libra).
//!
//! The core does no file, network or device I/O; `experiment` (whole experiments: a spec
//! in, its files and points out) reads the files a spec names and writes none. The `skewsim`
//! binary and the Python package are the edges. [`experiment::run_text`] is the entry point
//! for a whole experiment; `ARCHITECTURE.md` has the code map, the entry points and the
//! invariants every module keeps.

#![warn(missing_docs)]

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
