//! Balancing strategies: how a global batch is placed on workers.
//!
//! Owns the grouping of a global batch of packed sequences into fixed-size pools
//! (random, production, zigzag, zigzag-swap, VRSP — Libra Algorithm 1 — and unconstrained
//! LPT), and, later, each scheme's planner. Pure: no I/O.

pub mod distca;
pub mod grouping;
pub mod libra;
pub mod wlbllm;

pub use grouping::{group, imbalance, vrsp, Policy};
