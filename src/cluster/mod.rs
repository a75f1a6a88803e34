//! Cluster: what the machines are, how they are wired, and how identical GPUs fail to run
//! identically.
//!
//! Owns the topology description (parsed from TOML *text*; files are read at the edge),
//! the petgraph graph of GPUs, NVSwitches, NICs, leaf and spine switches and the links
//! between them, deterministic ECMP routing, summary measures (bisection bandwidth,
//! diameter), the per-GPU runtime-variance model and fault/straggler injection. It may not
//! do I/O, touch the engine's event queue, or price work (that is `cost/`); how bytes share
//! links over time is `net/`'s business.
//!
//! # Sections
//! - [`topology`]: [`TopologySpec`] (the file), [`Topology`] (the built graph), [`Route`].
//! - [`analysis`]: diameter and bisection bandwidth of a built topology.
//! - [`variance`]: persistent per-GPU slowdown and per-kernel jitter, calibrated to the
//!   published 256-GPU measurement (Libra reading note §3.3: mean 7.01%, peak 15.07%).
//! - [`faults`]: a GPU k× slower or a link at a fraction of its bandwidth from step s to t.
//!
//! Architecture invariant: routing and variance are pure functions of their inputs (flow id,
//! seed, GPU, step, layer, op); nothing depends on event order or thread count.

pub mod analysis;
pub mod faults;
pub mod topology;
pub mod variance;

pub use faults::{FaultSpec, Faults};
pub use topology::{Link, LinkId, LinkKind, Route, Topology, TopologySpec, Vertex, VertexId};
pub use variance::{VarianceModel, VarianceSpec};
