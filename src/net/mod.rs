//! The network half of the engine: how long bytes take to move between GPUs.
//!
//! One trait, [`NetworkModel`], with an analytical implementation (alpha–beta over the
//! bottleneck link, O(1) per transfer) and a flow-level one (max–min fair sharing of every
//! link, rates recomputed only when a flow starts or finishes). The engine drives either
//! through the same calls, so the two can be swapped and compared.
//!
//! Architecture invariant: a model is deterministic given its inputs; ties between flows
//! finishing at the same picosecond are broken by flow id.

/// Simulated time in picoseconds.
pub type Ps = u64;

/// A GPU's global index in the cluster (node-major: node * gpus_per_node + local).
pub type GpuId = u32;

/// A network model the engine drives. The engine calls [`NetworkModel::start`] when a
/// transfer becomes ready, asks [`NetworkModel::next_completion`] for the earliest finish
/// it must not step past, and calls [`NetworkModel::advance`] to collect the transfers
/// that finished by then.
pub trait NetworkModel {
    /// Start moving `bytes` from `src` to `dst` at time `now`. `tag` is the engine's own
    /// handle (an op id) and comes back from [`NetworkModel::advance`] when the transfer
    /// finishes. `src == dst` or `bytes == 0` finishes after the model's local latency.
    fn start(&mut self, now: Ps, src: GpuId, dst: GpuId, bytes: u64, tag: u64);

    /// The earliest time at which an active transfer finishes, if any is active.
    fn next_completion(&self) -> Option<Ps>;

    /// Advance the model to `now` (never past [`NetworkModel::next_completion`]) and push
    /// the tags of the transfers that finished at or before `now`, in (finish time, start
    /// order), onto `done`.
    fn advance(&mut self, now: Ps, done: &mut Vec<u64>);

    /// Fault injection (added by the cluster model; has a default so other implementors
    /// need not care): from `now` on, run `link` (a `cluster::LinkId`) at `scale` × its
    /// bandwidth, `scale` in (0, 1]. `cluster::Faults::link_changes(step)` says which links
    /// change at a step boundary. The default ignores it.
    fn set_link_scale(&mut self, now: Ps, link: u32, scale: f64) {
        let _ = (now, link, scale);
    }

    /// The flow-level model this is, if it is one: the engine then simulates parts of a
    /// graph whose traffic crosses disjoint links apart, on copies of it
    /// (`engine::split`). The default returns `None`.
    fn as_flow(&mut self) -> Option<&mut FlowModel> {
        None
    }

    /// The model's transfer durations when each is fixed by the transfer alone (never by
    /// other traffic or by when it starts): the engine then times a graph as a DAG
    /// (`engine::dag`), with no events. A model that returns them must finish every transfer
    /// [`FixedDurations::duration`] after its start (adding with saturation). The default
    /// (transfers share bandwidth) returns `None`.
    fn fixed_durations(&self) -> Option<&dyn FixedDurations> {
        None
    }
}

/// Transfer durations that depend only on the transfer: the one definition of what a
/// transfer costs in a model without contention, shared by its event-driven
/// [`NetworkModel::start`] and the engine's DAG sweep.
pub trait FixedDurations: Sync {
    /// Picoseconds to move `bytes` from `src` to `dst`; `tag` as in
    /// [`NetworkModel::start`] (a model may pick the route by it).
    fn duration(&self, src: GpuId, dst: GpuId, bytes: u64, tag: u64) -> Ps;

    /// True when [`FixedDurations::duration`] does not depend on the tag, so that
    /// transfers alike take the same time whichever collective moves them.
    fn tag_free(&self) -> bool {
        false
    }
}

pub mod analytical;
pub mod collective;
pub mod collective_fit;
pub mod flow;

pub use analytical::AnalyticalModel;
pub use flow::FlowModel;

/// Picoseconds to move `bytes` at `bytes_per_s`, rounded up (infinite rate: 0; zero or
/// negative rate: `Ps::MAX`). Both models use this one formula, so an uncontended transfer
/// takes exactly the same time in each.
pub fn transfer_ps(bytes: f64, bytes_per_s: f64) -> Ps {
    if bytes <= 0.0 || bytes_per_s == f64::INFINITY {
        return 0;
    }
    if bytes_per_s.is_nan() || bytes_per_s <= 0.0 {
        return Ps::MAX;
    }
    let ps = (bytes * 1.0e12 / bytes_per_s).ceil();
    if ps >= Ps::MAX as f64 {
        Ps::MAX
    } else {
        ps as Ps
    }
}
