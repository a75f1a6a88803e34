//! The event engine on a graph whose parts share no link until their coupling
//! collectives: the parts simulated apart (in parallel), then joined.
//!
//! A step's replicas couple only through the gradient all-reduces on the DP streams; no
//! other op waits for one. Under the flow-level model flows interact only through shared
//! links, so while no coupling transfer has started, a group of replicas whose flows
//! cross no link another group's flows cross runs exactly as in the whole graph. So:
//! 1. The *coupling streams* (DP streams) are set aside; the other streams fall into
//!    *parts* (streams joined by a dependency or a collective), grouped into workers,
//!    each with its own copy of the flow model.
//! 2. Every worker runs its streams alone up to a horizon no coupling transfer can start
//!    before: a coupling collective whose parts are all first on their streams starts at
//!    its parts' latest readiness, at or after the time the worker's own ops it waits for
//!    have ended; so a worker may run to the earliest such time it sees, and then every
//!    worker to the earliest start any collective can have given what all have seen.
//! 3. When no two workers' flows crossed one link, the workers are joined: their queues,
//!    stream states and flows form the state the whole graph's run has after processing
//!    every event up to the horizon, the coupling ops that are ready arrive at their
//!    readiness, and the run goes on as one.
//!
//! The result equals [`super::run_events`] on the whole graph: times, event count,
//! errors. Same-time events of different workers are handled in another order than
//! the whole graph's run handles them, which changes no time: max–min rates depend only
//! on which flows share a component, and a recomputation at a time at which a flow was
//! already re-rated leaves its bytes unchanged. Anything else (no coupling stream, one
//! part, grouped point-to-point collectives, a coupling op that is not a whole-group
//! collective, overlapping links, a model with traffic) runs the whole graph.

use std::cmp::Reverse;
use std::sync::atomic::Ordering::Relaxed;

use rayon::prelude::*;

use super::{Graph, OpId, OpKind, Shared, Sim, StreamId, StreamKind, Timeline, Worker};
use crate::error::Result;
use crate::net::{FlowModel, Ps};

/// No worker.
const NONE: u32 = u32::MAX;

/// Ops per worker wanted: small workers keep their ops and flows in cache (measured in
/// BENCHMARKS.md), so there are more workers than threads where memory allows.
const OPS_PER_WORKER: usize = 200_000;

/// Memory the workers' copies of the flow model's links may take together.
const MODEL_BYTES: usize = 256 << 20;

/// `g` run on `flow` by parts apart and then joined, when it splits (else `None`, and
/// `flow` is untouched).
pub(super) fn run_split(g: &Graph, flow: &mut FlowModel) -> Option<Result<Timeline>> {
    if !flow.is_idle() || g.part_count() > 0 {
        return None;
    }
    // Every worker holds a copy of the model's links.
    let link_bytes = flow.topology().links.len() * FlowModel::LINK_BYTES;
    let plan = Plan::new(g, MODEL_BYTES / link_bytes.max(1))?;
    let sh = Shared::new(g);
    let base: &FlowModel = flow;
    let mut models: Vec<FlowModel> = (0..plan.workers)
        .into_par_iter()
        .map(|_| base.idle_copy())
        .collect();
    let mut sims: Vec<Sim<'_, FlowModel>> = models
        .iter_mut()
        .enumerate()
        .map(|(w, m)| {
            let need = plan.need[w].clone();
            let met = vec![0; need.len()];
            let worker = Worker {
                owner: &plan.owner,
                me: w as u32,
                cand: &plan.cand,
                need,
                met,
                lower: true,
            };
            let mut sim = Sim::new(g, m, &sh, Some(worker));
            // A candidate this worker's ops do not hold up may start at once.
            if plan.need[w].contains(&0) {
                sim.horizon = 0;
            }
            sim
        })
        .collect();
    sims.par_iter_mut().for_each(|s| {
        s.start_streams();
        s.run_loop();
    });
    // The earliest start any candidate can have: its latest readiness among workers,
    // a worker that has not seen all of its ops end bounding it by its horizon.
    let horizon = (0..plan.need.first().map_or(0, Vec::len))
        .map(|k| {
            sims.iter()
                .filter_map(|s| {
                    let w = s.worker.as_ref()?;
                    Some(if w.need[k] == 0 { w.met[k] } else { s.horizon })
                })
                .max()
                .unwrap_or(0)
        })
        .min()
        .unwrap_or(Ps::MAX);
    sims.par_iter_mut().for_each(|s| {
        s.horizon = horizon;
        if let Some(w) = s.worker.as_mut() {
            w.lower = false;
        }
        s.run_loop();
    });
    // Every ready coupling collective must start at the horizon, not before it.
    if plan.starts_before(g, &sh, horizon) {
        return None;
    }
    let mut heap = Vec::new();
    let mut st = sims[0].st.clone();
    let (mut events, mut now) = (0, 0);
    for (w, s) in sims.into_iter().enumerate() {
        heap.extend(
            s.heap
                .into_iter()
                .map(|Reverse(e)| (e.time, w, e.seq, e.id)),
        );
        for (i, x) in s.st.iter().enumerate() {
            if plan.owner[i] == w as u32 {
                st[i] = *x;
            }
        }
        events += s.events;
        now = now.max(s.now);
    }
    if !links_disjoint(&models) {
        return None;
    }
    flow.join(models);
    heap.sort_unstable();
    let mut sim = Sim::new(g, flow, &sh, None);
    for (i, x) in sim.st.iter_mut().enumerate() {
        if plan.owner[i] != NONE {
            *x = st[i];
        }
    }
    for (time, _, _, id) in heap {
        sim.push(time, id);
    }
    sim.events = events;
    // The coupling ops ready by the horizon arrive at their readiness.
    let mut ready: Vec<(Ps, StreamId)> = plan
        .coupling
        .iter()
        .filter_map(|&s| {
            let op = sim.st[s as usize].head(g)?;
            (sh.deps_left[op as usize].load(Relaxed) == 0)
                .then(|| (sh.start[op as usize].load(Relaxed), s))
        })
        .collect();
    ready.sort_unstable();
    for (t, s) in ready {
        sim.now = t;
        sim.try_start(s);
    }
    sim.now = now.max(sim.now);
    sim.run_loop();
    let out = sim.stuck();
    let events = sim.events;
    Some(out.map(|()| sh.timeline(events)))
}

/// True when no link carried flows of two models.
fn links_disjoint(models: &[FlowModel]) -> bool {
    let mut seen: Vec<(u32, usize)> = models
        .iter()
        .enumerate()
        .flat_map(|(w, m)| m.used_links().map(move |l| (l, w)))
        .collect();
    seen.sort_unstable();
    seen.windows(2).all(|p| p[0].0 != p[1].0)
}

/// How a graph splits.
struct Plan {
    workers: usize,
    /// Per stream: its worker, `NONE` for a coupling stream.
    owner: Vec<u32>,
    /// The coupling streams.
    coupling: Vec<StreamId>,
    /// Per collective: its index among the candidates (coupling collectives whose parts
    /// are all first on their streams), or `NONE`.
    cand: Vec<u32>,
    /// Per worker, per candidate: how many (its op, candidate part) dependencies.
    need: Vec<Vec<u32>>,
}

impl Plan {
    /// The split of `g` over at most `max_workers` workers (but at least one per thread),
    /// if it has coupling streams and at least two parts.
    fn new(g: &Graph, max_workers: usize) -> Option<Plan> {
        let ns = g.streams.len();
        let coupled: Vec<bool> = (g.streams.iter())
            .map(|s| s.kind == StreamKind::DpComm)
            .collect();
        let coupling: Vec<StreamId> = (0..ns as StreamId)
            .filter(|&s| coupled[s as usize])
            .collect();
        if coupling.is_empty() {
            return None;
        }
        // Per stream: the other streams its ops' dependents lie on, and the coupling ops
        // among them (each once per dependency); None when a coupling op is not a
        // whole-group collective or has a dependent off the coupling streams.
        let links: Vec<(Vec<StreamId>, Vec<OpId>)> = (0..ns)
            .into_par_iter()
            .map(|s| {
                let mut other = Vec::new();
                let mut ext = Vec::new();
                for &op in g.stream_ops(s as StreamId) {
                    let oi = op as usize;
                    if coupled[s] {
                        match g.ops[oi].kind() {
                            OpKind::Coll(c) if g.colls[c as usize].p2p.is_none() => {}
                            _ => return None,
                        }
                    }
                    for &d in &g.succ[g.succ_off[oi] as usize..g.succ_off[oi + 1] as usize] {
                        let ds = g.ops[d as usize].stream;
                        match (coupled[s], coupled[ds as usize]) {
                            (true, false) => return None,
                            (false, true) => ext.push(d),
                            _ if ds as usize != s => other.push(ds),
                            _ => {}
                        }
                    }
                }
                other.sort_unstable();
                other.dedup();
                Some((other, ext))
            })
            .collect::<Option<_>>()?;
        let mut uf = UnionFind::new(ns);
        for (s, (other, _)) in links.iter().enumerate() {
            for &o in other {
                uf.union(s as u32, o);
            }
        }
        let mut cand = vec![NONE; g.colls.len()];
        let mut n_cand = 0;
        for (c, slot) in cand.iter_mut().enumerate() {
            let parts = &g.coll_parts[g.coll_part_off[c] as usize..g.coll_part_off[c + 1] as usize];
            let Some((&first, rest)) = parts.split_first() else {
                continue;
            };
            let s0 = g.ops[first as usize].stream;
            if coupled[s0 as usize] {
                if parts
                    .iter()
                    .any(|&p| !coupled[g.ops[p as usize].stream as usize])
                {
                    return None;
                }
                if parts
                    .iter()
                    .all(|&p| g.stream_first(g.ops[p as usize].stream, p))
                {
                    *slot = n_cand;
                    n_cand += 1;
                }
            } else {
                for &p in rest {
                    let s = g.ops[p as usize].stream;
                    if coupled[s as usize] {
                        return None;
                    }
                    uf.union(s0, s);
                }
            }
        }
        // Parts in order of their first stream, grouped into workers of about equal ops.
        let mut root_of = vec![NONE; ns];
        // Per part: its ops.
        let mut parts: Vec<usize> = Vec::new();
        for (s, _) in coupled.iter().enumerate().filter(|(_, &c)| !c) {
            let r = uf.find(s as u32) as usize;
            if root_of[r] == NONE {
                root_of[r] = parts.len() as u32;
                parts.push(0);
            }
            parts[root_of[r] as usize] += g.stream_ops(s as StreamId).len();
        }
        if parts.len() < 2 {
            return None;
        }
        let workers = (g.ops.len() / OPS_PER_WORKER)
            .min(max_workers)
            .max(rayon::current_num_threads())
            .min(parts.len());
        let total: usize = parts.iter().sum();
        let mut worker_of_part = Vec::with_capacity(parts.len());
        let mut acc = 0;
        for &n in &parts {
            // The worker whose share of the ops this part's middle falls in.
            let mid = acc + n / 2;
            worker_of_part.push(((mid * workers) / total.max(1)).min(workers - 1) as u32);
            acc += n;
        }
        let mut owner = vec![NONE; ns];
        for s in 0..ns {
            if !coupled[s] {
                let r = uf.find(s as u32) as usize;
                owner[s] = worker_of_part[root_of[r] as usize];
            }
        }
        let mut need = vec![vec![0u32; n_cand as usize]; workers];
        for (s, (_, ext)) in links.iter().enumerate() {
            for &d in ext {
                if let OpKind::Coll(c) = g.ops[d as usize].kind() {
                    if let Some(&k) = cand.get(c as usize).filter(|&&k| k != NONE) {
                        need[owner[s] as usize][k as usize] += 1;
                    }
                }
            }
        }
        Some(Plan {
            workers,
            owner,
            coupling,
            cand,
            need,
        })
    }

    /// True when some coupling collective has every part ready (its dependencies ended)
    /// at its stream's head, with the latest readiness before `horizon`: it would have
    /// started before the workers stopped.
    fn starts_before(&self, g: &Graph, sh: &Shared, horizon: Ps) -> bool {
        (0..g.colls.len()).into_par_iter().any(|c| {
            if self.cand[c] == NONE {
                return false;
            }
            let parts = &g.coll_parts[g.coll_part_off[c] as usize..g.coll_part_off[c + 1] as usize];
            let mut latest = 0;
            for &p in parts {
                if sh.deps_left[p as usize].load(Relaxed) != 0 {
                    return false;
                }
                latest = latest.max(sh.start[p as usize].load(Relaxed));
            }
            latest < horizon
        })
    }
}

/// Union–find over streams, joined to the smaller root.
struct UnionFind(Vec<u32>);

impl UnionFind {
    fn new(n: usize) -> Self {
        UnionFind((0..n as u32).collect())
    }

    fn find(&mut self, mut x: u32) -> u32 {
        while self.0[x as usize] != x {
            let p = self.0[x as usize];
            self.0[x as usize] = self.0[p as usize];
            x = p;
        }
        x
    }

    fn union(&mut self, a: u32, b: u32) {
        let (a, b) = (self.find(a), self.find(b));
        let (lo, hi) = (a.min(b), a.max(b));
        self.0[hi as usize] = lo;
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;
    use crate::cluster::{VarianceModel, VarianceSpec};
    use crate::cost::{CostModel, ModelConfig};
    use crate::engine::run_events;
    use crate::net::NetworkModel;
    use crate::schedule::step::build_step;
    use crate::schedule::{Parallelism, PipelineKind, Placement, RankMap};
    use crate::workload::PackedSeq;

    /// Split and joined, a step's run equals the whole graph's event run to the
    /// picosecond (timeline, event count), at one, two and three threads (other worker
    /// groupings), under random layouts (CP inside a node or across a leaf, TP, EP, GA,
    /// buckets, recomputation, pipeline stages), runtime variance with a slow GPU, and
    /// degraded links.
    #[test]
    fn split_run_equals_the_whole_run() {
        let topo = crate::cluster::topology::test_small();
        let c = CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap()).unwrap();
        let faults = crate::cluster::faults::Faults {
            gpu: vec![crate::cluster::faults::GpuFault {
                gpu: 5,
                slowdown: 1.5,
                from_step: 0,
                to_step: 9,
            }],
            link: Vec::new(),
        };
        let mut split = [0; 3];
        for seed in 0..30u64 {
            let mut rng = crate::rng::stream(seed, "split-differential", 0);
            let pp = [1, 1, 1, 2][rng.random_range(0..4)];
            let (tp, ep) = [(1, 1), (2, 1), (2, 2), (1, 2)][rng.random_range(0..4)];
            // At least two replicas.
            let cps: Vec<u32> = [2, 4, 8]
                .into_iter()
                .filter(|&cp| cp >= ep && cp * pp * tp <= 8)
                .collect();
            let cp = cps[rng.random_range(0..cps.len())];
            let dp = 16 / (pp * tp * cp);
            let ga = rng.random_range(1..4);
            let p = Parallelism {
                dp,
                pp,
                cp,
                ga,
                pipeline: PipelineKind::OneFOneB,
                recompute: rng.random_range(0..2) == 1,
                zero_stage: 0,
                dp_buckets: rng.random_range(1..4),
                tp,
                sp: true,
                tp_overlap: false,
                ep,
                moe_hot_share: if ep > 1 { 0.5 } else { 0.0 },
                precision: crate::schedule::Precision::Bf16,
            };
            let batch: Vec<Vec<PackedSeq>> = (0..dp)
                .map(|r| {
                    (0..ga)
                        .map(|m| {
                            let lens = [512 + 256 * r, 1024 + 128 * m, 100 * (r + m + 1)];
                            PackedSeq::from_lengths(&lens, 4096, 0)
                        })
                        .collect()
                })
                .collect();
            let map = RankMap::new(p, Placement::new(4, 4), "t").unwrap();
            let var = VarianceModel::new(VarianceSpec::default(), seed, map.gpus())
                .with_faults(faults.clone());
            let g = build_step(&c, map, &batch, 1, &var).unwrap().graph;
            let mut net = FlowModel::new(topo.clone());
            for _ in 0..rng.random_range(1..4) {
                let l = rng.random_range(0..topo.links.len() as u32);
                net.set_link_scale(0, l, rng.random_range(0.05..0.5));
            }
            let whole = run_events(&g, &mut net.idle_copy()).unwrap();
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut m = net.idle_copy();
                let r = pool.install(|| run_split(&g, &mut m));
                match r {
                    Some(r) => {
                        assert_eq!(r.unwrap(), whole, "{threads} threads under {p:?}");
                        // The joined model finished every transfer.
                        assert!(m.is_idle());
                        split[threads - 1] += 1;
                    }
                    // Several workers whose flows crossed one link run whole.
                    None => assert!(threads > 1 && pp > 1, "{p:?} ran whole"),
                }
            }
        }
        assert_eq!(split[0], 30);
        assert!(split[1] >= 15 && split[2] >= 15, "{split:?} split runs");
    }
}
