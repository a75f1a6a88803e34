//! Balancing strategies: how a global batch is placed on workers.
//!
//! Owns the grouping of a global batch of packed sequences into fixed-size pools
//! (random, production, zigzag, zigzag-swap, VRSP — Libra Algorithm 1 — and unconstrained
//! LPT), and each scheme's planner, lowered to the shared Plan IR through `plan::build`:
//! Ulysses ([`ulysses`]), WLB-LLM ([`wlbllm`], `wlbllm::lower`), DistCA ([`distca`],
//! `distca::lower`) and Libra ([`libra`]). Pure: no I/O.

pub mod distca;
pub mod grouping;
pub mod libra;
pub mod megatron_dcp;
pub mod pricing;
pub mod schemes;
pub mod ulysses;
pub mod wlbllm;

pub use grouping::{group, imbalance, vrsp, Policy};
