//! Collectives lowered onto point-to-point transfers, and their algorithm / bus bandwidth
//! as nccl-tests reports them.
//!
//! - all-to-all(v): one phase in which every rank sends to every other rank at once (what
//!   Ulysses, DistCA and Libra's tile exchange issue), or `n − 1` pairwise shift rounds;
//! - ring all-gather / reduce-scatter: `n − 1` steps of `S/n` to the next rank;
//! - ring all-reduce: reduce-scatter then all-gather, `2(n − 1)` steps of `S/n`;
//! - send/recv: every rank sends `S` to the next one (the nccl-tests `sendrecv` pattern;
//!   a single pair is a group of two);
//! - NVLS all-reduce (NVLink SHARP, in-switch reduction) inside one NVLink domain when the
//!   topology gives `nvlink.sharp_efficiency`: `multimem.ld_reduce` makes the switch read
//!   every rank's whole buffer (S up each GPU link) and return its reduced shard (S/n
//!   down), then `multimem.st` sends the shard up (S/n) and the switch writes it to every
//!   rank (S down). Each GPU link carries S(1 + 1/n) each way, once: lowered as one phase
//!   of shift-by-one transfers of S(1 + 1/n) × (link efficiency ÷ sharp efficiency) bytes,
//!   which loads exactly one up-link and one down-link per GPU for the time NVLS needs at
//!   its own (lower) achieved efficiency.
//!
//! A lowering is a list of *phases*; a phase starts when the previous one has completed
//! everywhere (a ring on homogeneous links proceeds in lock step, so this is its time).
//! [`run_phases`] drives any [`NetworkModel`] through them; [`analytical_phases`] prices
//! them in closed form: per transfer `α + load(bottleneck link) / capacity`, where a link's
//! load is every byte of the phase that crosses it. Without contention that is exactly what
//! the flow model gives; with it, max–min sharing can only be as slow or slower on some
//! flows and faster on none of the bottlenecked ones.
//!
//! Bus bandwidth (nccl-tests PERFORMANCE.md): `busbw = algbw × f`, `f = (n−1)/n` for
//! all-gather, reduce-scatter and all-to-all, `2(n−1)/n` for all-reduce, 1 for send/recv;
//! `algbw = S / time` with `S` the nccl-tests "size" (all-gather: the gathered output;
//! all-to-all: one rank's send buffer).

use std::collections::HashMap;

use serde::Serialize;

use crate::cluster::Topology;
use crate::error::{invalid, Result};
use crate::net::{transfer_ps, AnalyticalModel, GpuId, NetworkModel, Ps};

/// A collective operation, as nccl-tests names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Collective {
    /// Every rank sends `S/n` to every rank (one phase, all pairs concurrently).
    AllToAll,
    /// `n − 1` shift rounds; round k: rank i → rank i + k (pairwise exchange).
    AllToAllPairwise,
    /// Ring all-gather.
    AllGather,
    /// Ring reduce-scatter.
    ReduceScatter,
    /// Ring all-reduce.
    AllReduce,
    /// Each rank sends `S` to the next.
    SendRecv,
    /// All-reduce by NVLink SHARP in-switch reduction (one NVLink domain).
    AllReduceNvls,
}

impl Collective {
    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllToAll
            | Collective::AllToAllPairwise
            | Collective::AllGather
            | Collective::ReduceScatter => (n - 1.0) / n,
            Collective::AllReduce | Collective::AllReduceNvls => 2.0 * (n - 1.0) / n,
            Collective::SendRecv => 1.0,
        }
    }

    /// The name nccl-tests uses.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllToAll => "alltoall",
            Collective::AllToAllPairwise => "alltoall-pairwise",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllReduce => "all_reduce",
            Collective::SendRecv => "sendrecv",
            Collective::AllReduceNvls => "all_reduce (NVLS)",
        }
    }
}

/// One point-to-point transfer of a lowered collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Transfer {
    /// Sending GPU.
    pub src: GpuId,
    /// Receiving GPU.
    pub dst: GpuId,
    /// Bytes.
    pub bytes: u64,
}

/// Phases of transfers; phase k + 1 starts when phase k has completed.
pub type Phases = Vec<Vec<Transfer>>;

/// Lower `op` of nccl-tests size `bytes` over the ranks `group` (ring order = group
/// order).
pub fn lower(op: Collective, group: &[GpuId], bytes: u64) -> Result<Phases> {
    let n = group.len();
    if n < 2 {
        return Err(invalid("group size", n, "at least 2 ranks"));
    }
    let mut seen = group.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != n {
        return Err(invalid("group", format!("{group:?}"), "distinct GPU ids"));
    }
    let chunk = bytes / n as u64;
    let ring = |steps: usize| -> Phases {
        (0..steps)
            .map(|_| {
                (0..n)
                    .map(|i| Transfer {
                        src: group[i],
                        dst: group[(i + 1) % n],
                        bytes: chunk,
                    })
                    .collect()
            })
            .collect()
    };
    Ok(match op {
        Collective::AllGather | Collective::ReduceScatter => ring(n - 1),
        Collective::AllReduce => ring(2 * (n - 1)),
        Collective::AllReduceNvls => nvls(group, bytes, 1.0),
        Collective::SendRecv => vec![(0..n)
            .map(|i| Transfer {
                src: group[i],
                dst: group[(i + 1) % n],
                bytes,
            })
            .collect()],
        Collective::AllToAll => vec![(0..n)
            .flat_map(|i| {
                (0..n).filter(move |&j| j != i).map(move |j| Transfer {
                    src: group[i],
                    dst: group[j],
                    bytes: chunk,
                })
            })
            .collect()],
        Collective::AllToAllPairwise => (1..n)
            .map(|k| {
                (0..n)
                    .map(|i| Transfer {
                        src: group[i],
                        dst: group[(i + k) % n],
                        bytes: chunk,
                    })
                    .collect()
            })
            .collect(),
    })
}

fn nvls(group: &[GpuId], bytes: u64, stretch: f64) -> Phases {
    let n = group.len();
    let per_link = bytes as f64 * (n as f64 + 1.0) / n as f64 * stretch;
    vec![(0..n)
        .map(|i| Transfer {
            src: group[i],
            dst: group[(i + 1) % n],
            bytes: per_link.round() as u64,
        })
        .collect()]
}

/// Lower `op` as NCCL would on `topo`: an all-reduce whose ranks share one NVLink domain
/// that supports in-switch reduction becomes NVLS (returned op says which); everything
/// else as [`lower`].
pub fn lower_on(
    topo: &Topology,
    op: Collective,
    group: &[GpuId],
    bytes: u64,
) -> Result<(Collective, Phases)> {
    let phases = lower(op, group, bytes)?;
    let nv = &topo.spec.nvlink;
    let one_domain = group
        .iter()
        .all(|&g| g < topo.gpus() && topo.domain_of(g) == topo.domain_of(group[0]));
    match (op, nv.sharp_efficiency) {
        (Collective::AllReduce | Collective::AllReduceNvls, Some(e)) if one_domain => Ok((
            Collective::AllReduceNvls,
            nvls(group, bytes, nv.efficiency / e),
        )),
        (Collective::AllReduceNvls, _) => Err(invalid(
            "all_reduce (NVLS)",
            format!("{group:?}"),
            "ranks of one NVLink domain whose topology sets nvlink.sharp_efficiency",
        )),
        _ => Ok((op, phases)),
    }
}

/// All-to-all-v: rank i sends `matrix[i][j]` bytes to rank j, all at once.
pub fn lower_alltoallv(group: &[GpuId], matrix: &[Vec<u64>]) -> Result<Phases> {
    let n = group.len();
    if matrix.len() != n || matrix.iter().any(|row| row.len() != n) {
        return Err(invalid(
            "alltoallv matrix",
            format!("{} rows", matrix.len()),
            format!("{n} rows of {n} byte counts"),
        ));
    }
    Ok(vec![(0..n)
        .flat_map(|i| {
            (0..n)
                .filter(move |&j| j != i && matrix[i][j] > 0)
                .map(move |j| Transfer {
                    src: group[i],
                    dst: group[j],
                    bytes: matrix[i][j],
                })
        })
        .collect()])
}

/// Drive `model` through `phases` starting at `start`; returns the completion time.
/// Transfer `k` (counting across phases) carries tag `tag_base + k`, which is also its
/// ECMP flow id.
pub fn run_phases(model: &mut dyn NetworkModel, start: Ps, phases: &Phases, tag_base: u64) -> Ps {
    let mut t = start;
    let mut tag = tag_base;
    let mut done = Vec::new();
    for phase in phases {
        for tr in phase {
            model.start(t, tr.src, tr.dst, tr.bytes, tag);
            tag += 1;
        }
        let mut left = phase.len();
        while left > 0 {
            let Some(next) = model.next_completion() else {
                break;
            };
            model.advance(next, &mut done);
            left = left.saturating_sub(done.len());
            done.clear();
            t = t.max(next);
        }
    }
    t
}

/// Closed-form price of `phases` on the analytical model (same tags/ECMP choices as
/// [`run_phases`]): per phase, the slowest transfer's `α + load / capacity` of its most
/// loaded link.
pub fn analytical_phases(model: &AnalyticalModel, phases: &Phases, tag_base: u64) -> Ps {
    let topo = model.topology();
    let mut tag = tag_base;
    let mut total: Ps = 0;
    let mut load: HashMap<u32, f64> = HashMap::new();
    let mut routes = Vec::new();
    for phase in phases {
        load.clear();
        routes.clear();
        for tr in phase {
            let r = topo.route(tr.src, tr.dst, tag).ok();
            tag += 1;
            if let Some(r) = &r {
                for &l in r.links() {
                    *load.entry(l).or_insert(0.0) += tr.bytes as f64;
                }
            }
            routes.push((r, tr.bytes));
        }
        let mut phase_t: Ps = 0;
        for (r, bytes) in &routes {
            let t = match r {
                Some(r) if *bytes > 0 && !r.links().is_empty() => {
                    let beta = r
                        .links()
                        .iter()
                        .map(|&l| transfer_ps(load[&l], model.link_capacity(l)))
                        .max()
                        .unwrap_or(0);
                    topo.route_latency(r).saturating_add(beta)
                }
                _ => 0,
            };
            phase_t = phase_t.max(t);
        }
        total = total.saturating_add(phase_t);
    }
    total
}

/// One nccl-tests style row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BusBw {
    /// Collective.
    pub op: &'static str,
    /// Ranks.
    pub ranks: usize,
    /// nccl-tests size, bytes.
    pub bytes: u64,
    /// Time, µs.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbs: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbs: f64,
}

/// algbw and busbw of `op` over `ranks` ranks moving `bytes` in `time` ps.
pub fn bus_bandwidth(op: Collective, ranks: usize, bytes: u64, time: Ps) -> BusBw {
    let secs = time as f64 * 1e-12;
    let algbw = if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    };
    BusBw {
        op: op.name(),
        ranks,
        bytes,
        time_us: time as f64 * 1e-6,
        algbw_gbs: algbw,
        busbw_gbs: algbw * op.bus_factor(ranks),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::Rng as _;

    use super::*;
    use crate::cluster::{Topology, TopologySpec};
    use crate::net::FlowModel;
    use crate::rng::stream;

    fn shipped(name: &str, text: &str, nodes: u32) -> Arc<Topology> {
        Arc::new(
            TopologySpec::parse(text, name)
                .unwrap()
                .build(Some(nodes))
                .unwrap(),
        )
    }

    const DGX_ROCE: &str = include_str!("../../topologies/dgx-h200-roce.toml");

    fn both(topo: &Arc<Topology>, phases: &Phases) -> (Ps, Ps, Ps) {
        let mut f = FlowModel::new(topo.clone());
        let mut a = AnalyticalModel::new(topo.clone());
        let tf = run_phases(&mut f, 0, phases, 0);
        let ta = run_phases(&mut a, 0, phases, 0);
        (tf, ta, analytical_phases(&a, phases, 0))
    }

    #[test]
    fn ring_lowering_counts() {
        let p = lower(Collective::AllReduce, &[3, 1, 2], 300).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(
            p[0][0],
            Transfer {
                src: 3,
                dst: 1,
                bytes: 100
            }
        );
        assert_eq!(
            p[0][2],
            Transfer {
                src: 2,
                dst: 3,
                bytes: 100
            }
        );
        let p = lower(Collective::AllToAll, &[0, 1, 2, 3], 400).unwrap();
        assert_eq!(p[0].len(), 12);
        let p = lower(Collective::AllToAllPairwise, &[0, 1, 2, 3], 400).unwrap();
        assert_eq!((p.len(), p[2][3].dst), (3, 2));
        assert!(lower(Collective::AllGather, &[1], 8).is_err());
        assert!(lower(Collective::AllGather, &[1, 1], 8).is_err());
        assert!(lower_alltoallv(&[0, 1], &[vec![0, 5]]).is_err());
        assert_eq!(
            lower_alltoallv(&[0, 1], &[vec![0, 5], vec![0, 0]]).unwrap()[0].len(),
            1
        );
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        let b = bus_bandwidth(Collective::AllReduce, 8, 8_000_000_000, 1_000_000_000_000);
        assert_eq!(b.algbw_gbs, 8.0);
        assert_eq!(b.busbw_gbs, 14.0);
        assert_eq!(Collective::AllGather.bus_factor(8), 0.875);
    }

    #[test]
    fn dgx_h200_lands_near_published_nccl_tests() {
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 2);
        let node: Vec<GpuId> = (0..8).collect();
        let mut a = AnalyticalModel::new(t.clone());
        let mut bw = |op, bytes| {
            let p = lower(op, &node, bytes).unwrap();
            bus_bandwidth(op, 8, bytes, run_phases(&mut a, 0, &p, 0)).busbw_gbs
        };
        // nccl-tests all_gather_perf on 8×H200: ≈368 GB/s at 8 GiB, ≈97 GB/s at 8 MiB.
        let big = bw(Collective::AllGather, 8 << 30);
        let small = bw(Collective::AllGather, 8 << 20);
        assert!(
            (big - 368.0).abs() < 368.0 * 0.03,
            "8 GiB all-gather busbw {big}"
        );
        assert!(
            (small - 97.0).abs() < 97.0 * 0.05,
            "8 MiB all-gather busbw {small}"
        );
        // nccl-tests all_reduce_perf on 8×H200 (NVLS): ≈475 GB/s at large sizes.
        let (op, p) = lower_on(&t, Collective::AllReduce, &node, 8 << 30).unwrap();
        assert_eq!(op, Collective::AllReduceNvls);
        let mut a1 = AnalyticalModel::new(t.clone());
        let ar = bus_bandwidth(op, 8, 8 << 30, run_phases(&mut a1, 0, &p, 0)).busbw_gbs;
        assert!(
            (ar - 475.0).abs() < 475.0 * 0.03,
            "8 GiB all-reduce busbw {ar}"
        );
        // Across domains NVLS does not apply.
        let (op, _) = lower_on(&t, Collective::AllReduce, &[0, 8], 1 << 20).unwrap();
        assert_eq!(op, Collective::AllReduce);
        // One 400 Gb/s NIC between nodes: 48–49 GB/s for a large message.
        let mut a2 = AnalyticalModel::new(t.clone());
        let p = vec![vec![Transfer {
            src: 0,
            dst: 8,
            bytes: 1 << 30,
        }]];
        let secs = run_phases(&mut a2, 0, &p, 0) as f64 * 1e-12;
        let gbs = (1u64 << 30) as f64 / secs / 1e9;
        assert!((48.0..=49.0).contains(&gbs), "NIC {gbs} GB/s");
    }

    #[test]
    fn flow_agrees_with_analytical_when_uncontended() {
        // Random sizes and placements: single transfers, rings inside a node, rail-aligned
        // rings under one leaf, all-to-all inside a node.
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 8);
        let mut rng = stream(1, "differential", 0);
        for case in 0..60 {
            let bytes = rng.random_range(1u64..(1 << 30));
            let phases = match case % 4 {
                0 => {
                    let src = rng.random_range(0..t.gpus());
                    let dst = rng.random_range(0..t.gpus());
                    vec![vec![Transfer { src, dst, bytes }]]
                }
                1 => {
                    let node = rng.random_range(0..8u32);
                    let n = rng.random_range(2..=8usize);
                    let mut g: Vec<GpuId> = (0..8).map(|l| node * 8 + l).collect();
                    for i in (1..8).rev() {
                        g.swap(i, rng.random_range(0..=i));
                    }
                    g.truncate(n);
                    let op = [Collective::AllGather, Collective::AllReduce][case % 3 % 2];
                    lower(op, &g, bytes).unwrap()
                }
                2 => {
                    // Same rail of several nodes: all under one rail leaf, no spine.
                    let rail = rng.random_range(0..8u32);
                    let n = rng.random_range(2..=8u32);
                    let g: Vec<GpuId> = (0..n).map(|node| node * 8 + rail).collect();
                    lower(Collective::ReduceScatter, &g, bytes).unwrap()
                }
                _ => {
                    let node = rng.random_range(0..8u32);
                    let g: Vec<GpuId> = (0..8).map(|l| node * 8 + l).collect();
                    lower(Collective::AllToAll, &g, bytes).unwrap()
                }
            };
            let (tf, ta, tc) = both(&t, &phases);
            if case % 4 != 3 {
                // No two transfers of a phase share a link: per-transfer alpha–beta holds.
                let rel = (tf as f64 - ta as f64).abs() / ta.max(1) as f64;
                assert!(rel <= 0.01, "case {case}: flow {tf} vs analytical {ta}");
            }
            let rel = (tf as f64 - tc as f64).abs() / tc.max(1) as f64;
            assert!(rel <= 0.01, "case {case}: flow {tf} vs closed form {tc}");
        }
    }

    /// 4 nodes × 1 GPU, 1 NIC of 100 Gb/s (12.5 GB/s) each, 2 nodes per leaf, 1 spine,
    /// oversubscription 4: each leaf's single uplink is 2 × 12.5 / 4 = 6.25 GB/s.
    const OVERSUB: &str = r#"
name = "oversub"
nodes = 4
gpus_per_node = 1
[nvlink]
bandwidth_gbyte_s = 100.0
efficiency = 1.0
latency_us = 0.0
[nic]
per_node = 1
bandwidth_gbit_s = 100.0
efficiency = 1.0
latency_us = 2.0
pcie_gbyte_s = 64.0
[fabric]
hosts_per_leaf = 2
spines = 1
oversubscription = 4.0
hop_latency_us = 0.0
rail_optimized = true
"#;

    #[test]
    fn two_alltoalls_on_an_oversubscribed_spine_slow_each_other_as_max_min_says() {
        let t = shipped("oversub.toml", OVERSUB, 4);
        // X = {gpu0 (leaf 0), gpu2 (leaf 1)}, Y = {gpu1 (leaf 0), gpu3 (leaf 1)}.
        // X sends 2 × 4 MB (size 8 MB over 2 ranks), Y 2 × 2 MB.
        let x = lower(Collective::AllToAll, &[0, 2], 8_000_000).unwrap();
        let y = lower(Collective::AllToAll, &[1, 3], 4_000_000).unwrap();
        // Alone, X's flows (one each way) each own a 6.25 GB/s spine uplink/downlink:
        // 4 MB / 6.25 GB/s = 640 µs, + 2 µs latency.
        let alone = |p: &Phases| {
            let mut f = FlowModel::new(t.clone());
            run_phases(&mut f, 0, p, 0)
        };
        assert_eq!(alone(&x), 642_000_000);
        assert_eq!(alone(&y), 322_000_000);
        // Together: leaf0→spine carries X's 0→2 and Y's 1→3 (3.125 GB/s each), likewise
        // the other direction. Y's 2 MB drain at 2e6 / 3.125e9 = 640 µs; X has 2 MB left
        // and then runs alone at 6.25 GB/s: 320 µs more. X ends at 960 µs + 2 µs, Y at
        // 640 µs + 2 µs.
        let mut f = FlowModel::new(t.clone());
        for (k, tr) in x[0].iter().chain(y[0].iter()).enumerate() {
            f.start(0, tr.src, tr.dst, tr.bytes, k as u64);
        }
        let mut done = Vec::new();
        let mut fin = HashMap::new();
        while let Some(now) = f.next_completion() {
            f.advance(now, &mut done);
            for tag in done.drain(..) {
                fin.insert(tag, now);
            }
        }
        assert_eq!(fin[&0], 962_000_000);
        assert_eq!(fin[&1], 962_000_000);
        assert_eq!(fin[&2], 642_000_000);
        assert_eq!(fin[&3], 642_000_000);
        // The analytical model ignores the other collective: it predicts X alone.
        let a = AnalyticalModel::new(t.clone());
        assert_eq!(analytical_phases(&a, &x, 0), 642_000_000);
    }
}
