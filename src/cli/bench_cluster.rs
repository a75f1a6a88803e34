//! Benchmarks of the cluster model (issue 3): topology build + routing at 16,384 GPUs, the
//! flow model's event rate on a 4,096-GPU all-to-all, and how one rate recomputation's
//! cost grows with the number of active flows. Each returns rows; `skewsim bench` (or
//! `skewsim topo --bench`) prints them. Timings are wall clock of a release build.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;

use super::bench::Timed;
use serde::Serialize;

use skewsim::cluster::{Topology, TopologySpec};
use skewsim::net::collective::{lower, Collective};
use skewsim::net::{FlowModel, NetworkModel};

const DGX_ROCE: &str = include_str!("../../topologies/dgx-h200-roce.toml");

/// One benchmark measurement.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// Benchmark name.
    pub bench: String,
    /// What was measured.
    pub metric: String,
    /// The number.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// Target or context.
    pub note: String,
}

fn row(bench: &str, metric: &str, value: f64, unit: &str, note: &str) -> BenchRow {
    BenchRow {
        bench: bench.into(),
        metric: metric.into(),
        value,
        unit: unit.into(),
        note: note.into(),
    }
}

fn dgx(nodes: u32) -> Result<Topology> {
    Ok(TopologySpec::parse(DGX_ROCE, "topologies/dgx-h200-roce.toml")?.build(Some(nodes))?)
}

/// Build the 16,384-GPU DGX H200 RoCE topology (petgraph graph included) and route one
/// flow from every GPU to each of 64 destinations (1,048,576 routes, a shift pattern that
/// crosses every tier). Target: < 2 s in all.
pub fn topo_build_route() -> Result<Vec<BenchRow>> {
    let t0 = Instant::now();
    let topo = dgx(2048)?;
    let build = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let n = topo.gpus();
    let mut hops = 0u64;
    let mut flow = 0u64;
    for src in 0..n {
        for k in 0..64u32 {
            let dst = (src + 1 + k * 257) % n;
            hops += topo.route(src, dst, flow)?.links().len() as u64;
            flow += 1;
        }
    }
    let route = t1.elapsed().as_secs_f64();
    let b = "topo-build-route";
    Ok(vec![
        row(b, "GPUs", f64::from(n), "", "dgx-h200-roce --nodes 2048"),
        row(b, "links", topo.links.len() as f64, "", ""),
        row(b, "build", build, "s", "graph + link arena"),
        row(
            b,
            "route 1,048,576 flows",
            route,
            "s",
            &format!("{hops} hops in all"),
        ),
        row(b, "build + route", build + route, "s", "target < 2 s"),
    ])
}

/// A 4,096-GPU (512-node) all-to-all lowered as pairwise shift rounds (round k: GPU i →
/// GPU i + k), `rounds` rounds of 1 MiB per pair, on the flow model. Events = flow starts
/// + flow completions. Target: ≥ 1,000,000 events/s.
pub fn flow_alltoall(rounds: usize) -> Result<Vec<BenchRow>> {
    let topo = Arc::new(dgx(512)?);
    let group: Vec<u32> = (0..topo.gpus()).collect();
    let n = group.len() as u64;
    let phases = lower(Collective::AllToAllPairwise, &group, n << 20)?;
    let rounds = rounds.min(phases.len());
    let mut model = FlowModel::new(topo);
    let t0 = Instant::now();
    let mut now = 0;
    let mut tag = 0u64;
    let mut done = Vec::new();
    for phase in &phases[..rounds] {
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
    let secs = t0.elapsed().as_secs_f64();
    let s = model.stats();
    let events = (s.starts + s.finishes) as f64;
    let b = "flow-alltoall-4096";
    Ok(vec![
        row(
            b,
            "rounds",
            rounds as f64,
            "",
            "of 4,095 pairwise rounds, 1 MiB per pair",
        ),
        row(b, "flow events", events, "", "starts + completions"),
        row(b, "rate recomputations", s.recomputes as f64, "", ""),
        row(
            b,
            "mean flows per recomputation",
            s.flows_rerated as f64 / s.recomputes.max(1) as f64,
            "",
            "",
        ),
        row(b, "wall", secs, "s", ""),
        row(b, "events/s", events / secs, "1/s", "target ≥ 1,000,000"),
        row(b, "simulated time", now as f64 * 1e-6, "µs", ""),
    ])
}

/// Cost of one rate recomputation against the number of active flows, on the 4,096-GPU
/// topology, median of 5 repeats of "start one more flow, recompute":
/// - `one component`: all F flows leave GPU 0 (they share its PCIe and NIC links), so the
///   new flow's component is every active flow — the worst case;
/// - `random`: F flows between random GPUs of different nodes; only the new flow's
///   component is re-rated (the count re-rated is reported).
pub fn recompute_scaling() -> Result<Vec<BenchRow>> {
    let topo = Arc::new(dgx(512)?);
    let gpus = topo.gpus();
    let mut rows = Vec::new();
    for giant in [true, false] {
        for f in [256u32, 1024, 4096, 16384, 65536] {
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
            let rerated = (model.stats().flows_rerated - before) as f64 / 5.0;
            times.sort_by(f64::total_cmp);
            let med = times[2];
            rows.push(row(
                if giant {
                    "recompute-one-comp"
                } else {
                    "recompute-random"
                },
                &format!("{} active flows", f + 1),
                med * 1e6,
                "µs",
                &format!(
                    "{rerated:.0} flows re-rated; {:.1} ns per re-rated flow",
                    med * 1e9 / rerated.max(1.0)
                ),
            ));
        }
    }
    Ok(rows)
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
        for phase in &phases[..64] {
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
            "{events} flow events, {} recomputations, {:.2} M events/s",
            s.recomputes,
            events / t0.elapsed().as_secs_f64() / 1e6
        ))
    }))
}

/// All cluster benchmarks, in order; the flow benchmark runs `rounds` all-to-all rounds.
pub fn all(rounds: usize) -> Result<Vec<BenchRow>> {
    let mut rows = topo_build_route()?;
    rows.extend(flow_alltoall(rounds)?);
    rows.extend(recompute_scaling()?);
    // The two `skewsim bench` arms, once each, as that command times them.
    for (name, target, setup) in [
        ("topo-16k", 2.0, arm_topo_16k as fn() -> Result<Timed>),
        ("flow-a2a-4096", 0.524, arm_flow_a2a_4096),
    ] {
        let mut timed = setup()?;
        let t0 = Instant::now();
        let detail = timed()?;
        rows.push(row(
            &format!("arm {name}"),
            "wall",
            t0.elapsed().as_secs_f64(),
            "s",
            &format!("target ≤ {target} s; {detail}"),
        ));
    }
    Ok(rows)
}

/// A text table of rows.
pub fn table(rows: &[BenchRow]) -> String {
    let mut s = format!(
        "{:<20} {:<32} {:>16} {:<4} {}\n",
        "bench", "metric", "value", "unit", "note"
    );
    for r in rows {
        s += &format!(
            "{:<20} {:<32} {:>16.4} {:<4} {}\n",
            r.bench, r.metric, r.value, r.unit, r.note
        );
    }
    s
}
