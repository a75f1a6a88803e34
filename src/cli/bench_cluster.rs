//! Benchmark arms of the cluster model, registered in `bench::ARMS`: topology
//! build + routing at 16,384 GPUs (`topo-16k`), the flow model's event rate on a 4,096-GPU
//! all-to-all (`flow-a2a-4096`: 64 rounds; `flow-a2a-4096-full`: all 4,095), and how one
//! rate recomputation's cost grows with the number of active flows
//! (`recompute-scaling`). `skewsim bench NAME` prints them; timings are wall clock of a
//! release build. (`skewsim topo --bench` printed these before the registry had them.)

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;

use super::bench::Timed;

use skewsim::cluster::{Topology, TopologySpec};
use skewsim::net::collective::{lower, Collective};
use skewsim::net::{FlowModel, NetworkModel};

const DGX_ROCE: &str = include_str!("../../topologies/dgx-h200-roce.toml");

fn dgx(nodes: u32) -> Result<Topology> {
    Ok(TopologySpec::parse(DGX_ROCE, "topologies/dgx-h200-roce.toml")?.build(Some(nodes))?)
}

/// One point of [`recompute_scaling`].
#[derive(Clone, Debug, PartialEq)]
pub struct RecomputeRow {
    /// All flows in one component (`true`) or random inter-node flows.
    pub one_component: bool,
    /// Active flows when the measured flow starts (F + 1).
    pub active: u32,
    /// Median wall time of one recomputation, µs.
    pub median_us: f64,
    /// Flows re-rated per recomputation (mean of the 5).
    pub rerated: f64,
}

/// Cost of one rate recomputation against the number of active flows, on the 4,096-GPU
/// topology, median of 5 repeats of "start one more flow, recompute":
/// - `one component`: all F flows leave GPU 0 (they share its PCIe and NIC links), so the
///   new flow's component is every active flow — the worst case;
/// - `random`: F flows between random GPUs of different nodes; only the new flow's
///   component is re-rated (the count re-rated is reported).
pub fn recompute_scaling(topo: &Arc<Topology>, flows: &[u32]) -> Vec<RecomputeRow> {
    let gpus = topo.gpus();
    let mut rows = Vec::new();
    for giant in [true, false] {
        for &f in flows {
            let mut model = FlowModel::new(topo.clone());
            for i in 0..f {
                let (src, dst) = if giant {
                    (0, 8 + (i * 7919) % (gpus - 8))
                } else {
                    let src = (i * 7919) % gpus;
                    (src, (src + 8 + (i * 31) % (gpus - 16)) % gpus)
                };
                model.start(0, src, dst, 1 << 30, u64::from(i));
            }
            model.advance(0, &mut Vec::new());
            let before = model.stats().flows_rerated;
            let mut times = Vec::new();
            for r in 0..5u64 {
                let now = 1 + r;
                let src = if giant { 0 } else { 5 + 8 * r as u32 };
                model.start(now, src, gpus - 1 - r as u32, 1 << 30, u64::from(f) + r);
                let t0 = Instant::now();
                model.advance(now, &mut Vec::new());
                times.push(t0.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            rows.push(RecomputeRow {
                one_component: giant,
                active: f + 1,
                median_us: times[2] * 1e6,
                rerated: (model.stats().flows_rerated - before) as f64 / 5.0,
            });
        }
    }
    rows
}

/// The detail line of arm `recompute-scaling`: per case, active flows → median µs (flows
/// re-rated, ns per re-rated flow).
pub fn recompute_detail(rows: &[RecomputeRow]) -> String {
    let mut parts = Vec::new();
    for giant in [true, false] {
        let cells: Vec<String> = rows
            .iter()
            .filter(|r| r.one_component == giant)
            .map(|r| {
                format!(
                    "{} → {:.1} µs ({:.0} re-rated, {:.0} ns each)",
                    r.active,
                    r.median_us,
                    r.rerated,
                    r.median_us * 1e3 / r.rerated.max(1.0)
                )
            })
            .collect();
        let case = if giant { "one component" } else { "random" };
        parts.push(format!("{case}: {}", cells.join(", ")));
    }
    parts.join("; ")
}

/// Arm `recompute-scaling`: [`recompute_scaling`] at 256 … 65,536 active flows on the
/// 4,096-GPU topology (built untimed); the timed run is the whole sweep, the detail line
/// its per-recomputation medians.
pub fn arm_recompute_scaling() -> Result<Timed> {
    let topo = Arc::new(dgx(512)?);
    Ok(Box::new(move || {
        let rows = recompute_scaling(&topo, &[256, 1024, 4096, 16384, 65536]);
        Ok(recompute_detail(&rows))
    }))
}

/// Arm `topo-16k` (target 2 s): build the 16,384-GPU DGX H200 topology and route
/// 1,048,576 flows on it, all timed.
pub fn arm_topo_16k() -> Result<Timed> {
    Ok(Box::new(|| {
        let topo = dgx(2048)?;
        let n = topo.gpus();
        let mut hops = 0u64;
        for src in 0..n {
            for k in 0..64u32 {
                let dst = (src + 1 + k * 257) % n;
                hops += topo
                    .route(src, dst, u64::from(src) * 64 + u64::from(k))?
                    .links()
                    .len() as u64;
            }
        }
        Ok(format!(
            "{n} GPUs, {} links, 1,048,576 routes ({hops} hops)",
            topo.links.len()
        ))
    }))
}

/// Arm `flow-a2a-4096` (target 0.524 s = 524,288 flow events at 1 M events/s): the first
/// 64 pairwise rounds of a 4,096-GPU all-to-all on the flow model; topology and lowering
/// built untimed.
pub fn arm_flow_a2a_4096() -> Result<Timed> {
    flow_a2a_4096(64)
}

/// Arm `flow-a2a-4096-full`: the whole 4,095-round all-to-all (33,546,240 flow events).
pub fn arm_flow_a2a_4096_full() -> Result<Timed> {
    flow_a2a_4096(4095)
}

/// The first `rounds` pairwise rounds of a 4,096-GPU (512-node) all-to-all, 1 MiB per pair
/// (round k: GPU i → GPU i + k; a round starts when the previous one completed).
fn flow_a2a_4096(rounds: usize) -> Result<Timed> {
    let topo = Arc::new(dgx(512)?);
    let group: Vec<u32> = (0..topo.gpus()).collect();
    let phases = lower(
        Collective::AllToAllPairwise,
        &group,
        (group.len() as u64) << 20,
    )?;
    Ok(Box::new(move || {
        let t0 = Instant::now();
        let mut model = FlowModel::new(topo.clone());
        let mut now = 0;
        let mut tag = 0u64;
        let mut done = Vec::new();
        for phase in &phases[..rounds.min(phases.len())] {
            for tr in phase {
                model.start(now, tr.src, tr.dst, tr.bytes, tag);
                tag += 1;
            }
            let mut left = phase.len();
            while left > 0 {
                let Some(t) = model.next_completion() else {
                    break;
                };
                model.advance(t, &mut done);
                left = left.saturating_sub(done.len());
                done.clear();
                now = t;
            }
        }
        let s = model.stats();
        let events = (s.starts + s.finishes) as f64;
        Ok(format!(
            "{events} flow events, {} recomputations ({:.0} flows re-rated each), {:.2} M events/s",
            s.recomputes,
            s.flows_rerated as f64 / s.recomputes.max(1) as f64,
            events / t0.elapsed().as_secs_f64() / 1e6
        ))
    }))
}
