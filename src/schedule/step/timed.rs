//! A step with Ulysses' attention timed part by part, with no graph of the whole step.
//!
//! The replicas couple only through the gradient all-reduces on the DP streams, and no op
//! of a replica waits for an all-reduce. So under a network whose transfer durations are
//! fixed ([`FixedDurations`]) the step is timed exactly as:
//! 1. each part of replicas emitted, swept alone ([`run_dag_within`]: its transfers take
//!    the tags the whole graph's ids give them), measured and dropped, keeping per GPU its
//!    time split up to its earliest bucket-ready time, its merged intervals from then on,
//!    its forward spans, and the ends of its bucket-ready ops;
//! 2. the all-reduces swept with those ends as earliest starts;
//! 3. each GPU's split completed with its DP stream's intervals ([`GpuSpans`]).
//!
//! The whole graph's ids of a part's ops and collectives follow from every part's phase
//! marks ([`Layout`]); parts of equal size emit the same marks, so the first part (and
//! the last, when smaller) gives them before any part is timed, and every part is checked
//! against them. Memory holds a few parts at a time and per-GPU facts, not the step's ops.
//!
//! Anything else (another network model, a part whose marks differ, an error) takes the
//! whole graph's path ([`super::build_step`], [`crate::engine::run`]), which gives the same
//! report, trace and errors.

use rayon::prelude::*;

use super::{build_step, checked, emit_part, emit_reduce, step_facts, Emitted, StepEnv};
use crate::cost::CostModel;
use crate::engine::dag::{run_dag_within, Within};
use crate::engine::parts::{Layout, Mark, Part};
use crate::engine::{run, Graph, OpId, StreamKind};
use crate::error::{invalid, Result};
use crate::net::{FixedDurations, NetworkModel, Ps};
use crate::report::step::{report_of, step_report, GpuSpans, GpuTimes, Iv, StepReport};
use crate::report::trace::{chrome_trace, compose, stream_events, traced_gpus};
use crate::schedule::{RankMap, RuntimeVariance};
use crate::workload::PackedSeq;

/// The most parts a step is timed in (small parts stay in cache).
const MAX_PARTS: usize = 1024;

/// A step simulated and measured.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRun {
    /// Its report.
    pub report: StepReport,
    /// Its Perfetto trace of the first GPUs, when asked for.
    pub trace: Option<String>,
}

/// Simulate and measure step `step` with Ulysses' attention (`batch` as for
/// [`build_step`]) on `net`, with the trace of the first `trace` GPUs (all when 0) when
/// asked for: part by part when `net` fixes transfer durations, else on the whole graph;
/// the same report and trace either way.
pub fn run_step(
    cost: &CostModel,
    map: RankMap,
    batch: &[Vec<PackedSeq>],
    step: u64,
    var: &dyn RuntimeVariance,
    net: &mut dyn NetworkModel,
    trace: Option<u32>,
) -> Result<StepRun> {
    let env = StepEnv { map, var, step };
    let parts = net
        .fixed_durations()
        .and_then(|d| in_parts(cost, env, batch, d, trace, MAX_PARTS).ok());
    let whole = |net: &mut dyn NetworkModel| -> Result<StepRun> {
        let sg = build_step(cost, map, batch, step, var)?;
        let t = run(&sg.graph, net)?;
        Ok(StepRun {
            report: step_report(&sg, &t, cost, step),
            trace: trace.map(|n| chrome_trace(&sg, &t, n)),
        })
    };
    match parts {
        Some(r) => {
            // In the crate's own tests every step timed in parts is also a differential
            // test against the whole graph.
            #[cfg(test)]
            assert_eq!(
                r,
                whole(net)?,
                "the step timed in parts differs from the whole"
            );
            Ok(r)
        }
        None => whole(net),
    }
}

/// What one part's sweep leaves.
struct PartFacts {
    /// Per GPU of the part: its id, its split up to its earliest bucket-ready time, its
    /// merged intervals from then on, its forward spans per micro-batch.
    gpus: Vec<(u32, GpuTimes, GpuSpans, Vec<Iv>)>,
    /// (all-reduce op, end of the op it waits for).
    ready: Vec<(OpId, Ps)>,
    /// Per traced GPU of the part: its id and its streams' events.
    trace: Vec<(u32, Vec<Vec<String>>)>,
    events: u64,
    makespan: Ps,
}

/// [`run_step`] in up to `max_parts` parts of replicas (the report does not depend on how
/// many).
pub(super) fn in_parts(
    cost: &CostModel,
    env: StepEnv<'_>,
    batch: &[Vec<PackedSeq>],
    net: &dyn FixedDurations,
    trace: Option<u32>,
    max_parts: usize,
) -> Result<StepRun> {
    let map = env.map;
    if map.par.gathers_params_early() {
        return Err(invalid(
            "overlap_param_gather",
            true,
            "false to time a step in parts (the parameter gathers couple the replicas' forwards)",
        ));
    }
    let (shard, split) = checked(cost, map.par, batch, false)?;
    let cost1 = &shard;
    let dp = map.par.dp as usize;
    if dp == 0 {
        return Err(invalid("dp", 0, "at least 1 to time a step in parts"));
    }
    let cs = dp.div_ceil(max_parts.clamp(1, dp));
    let nq = dp.div_ceil(cs);
    let size = |q: usize| cs.min(dp - q * cs);
    // The marks, bucket-ready ops and all-reduce phases of a part of each size.
    let first = emit_part(cost1, &env, batch, split, 0, size(0))?;
    let last = if size(nq - 1) != size(0) {
        Some(emit_part(
            cost1,
            &env,
            batch,
            split,
            (nq - 1) * cs,
            size(nq - 1),
        )?)
    } else {
        None
    };
    let model = |q: usize| -> &Emitted {
        match &last {
            Some(l) if size(q) != size(0) => l,
            _ => &first,
        }
    };
    let (red, red_marks) = emit_reduce(cost1, &env, batch, cs, &first, |q| &model(q).ready);
    let full = |x: &Emitted| -> Vec<Mark> {
        let mut m = x.part.marks.clone();
        m.push(x.part.b.mark());
        m
    };
    let (m_first, m_last) = (full(&first), last.as_ref().map(full));
    let marks_of = |q: usize| -> &[Mark] {
        match &m_last {
            Some(l) if size(q) != size(0) => l,
            _ => &m_first,
        }
    };
    let mut all: Vec<Vec<Mark>> = (0..nq).map(|q| marks_of(q).to_vec()).collect();
    let mut rm = red_marks;
    rm.push(red.cx.b.mark());
    all.push(rm);
    let layout = Layout::new(&all);
    drop(all);
    let ext = red.ext;
    let rg = red.cx.b.build()?;
    let spg = map.streams_per_gpu();
    // Per GPU: 0 when one of its all-reduce parts waits for nothing in its part, else
    // `Ps::MAX` (lowered to its bucket-ready ends as its part is swept).
    let mut t0 = vec![Ps::MAX; map.gpus() as usize];
    let mut waits = vec![false; rg.ops.len()];
    let mut by_part: Vec<Vec<(OpId, OpId)>> = vec![Vec::new(); nq];
    for &(q, dep, op) in &ext {
        waits[op as usize] = true;
        by_part[q as usize].push((dep, op));
    }
    for (op, _) in waits.iter().enumerate().filter(|(_, &w)| !w) {
        t0[gpu_of(&rg, op as OpId) as usize] = 0;
    }
    let n_trace = trace.map_or(0, |n| traced_gpus(&map, n));
    let facts: Vec<PartFacts> = (0..nq)
        .into_par_iter()
        .map(|q| {
            let x = emit_part(cost1, &env, batch, split, q * cs, size(q))?;
            let m = model(q);
            let same = x.part.marks.len() == m.part.marks.len()
                && x.part
                    .marks
                    .iter()
                    .zip(&m.part.marks)
                    .all(|(a, b)| a.same_ids(b))
                && x.part.b.mark().same_ids(&m.part.b.mark())
                && x.ready == m.ready
                && x.reduce_at == m.reduce_at;
            if !same {
                return Err(invalid(
                    format!("step part {q} layout"),
                    "phases unlike its size's first part",
                    "parts of equal size with equal phases",
                ));
            }
            let at = Swept {
                map: &map,
                layout: &layout,
                net,
                rg: &rg,
                t0: &t0,
                n_trace,
            };
            at.part(x, q, &by_part[q])
        })
        .collect::<Result<_>>()?;
    let mut release = vec![0; rg.ops.len()];
    let (mut events, mut makespan) = (0, 0);
    let mut per_gpu: Vec<Option<(GpuTimes, GpuSpans, Vec<Iv>)>> =
        (0..map.gpus()).map(|_| None).collect();
    let mut traced: Vec<Vec<Vec<String>>> = vec![Vec::new(); n_trace as usize];
    for f in facts {
        for (op, end) in f.ready {
            release[op as usize] = end;
        }
        for (g, head, tail, fwd) in f.gpus {
            per_gpu[g as usize] = Some((head, tail, fwd));
        }
        for (g, ev) in f.trace {
            traced[g as usize] = ev;
        }
        events += f.events;
        makespan = makespan.max(f.makespan);
    }
    let within = Within {
        layout: &layout,
        part: nq,
        release: &release,
    };
    let rt = run_dag_within(&rg, net, within)?;
    events += rt.events;
    makespan = makespan.max(rt.makespan);
    let dp_stream = |g: u32| spg * g + StreamKind::DpComm as u32;
    let measured: Vec<(GpuTimes, Vec<Iv>)> = per_gpu
        .into_par_iter()
        .enumerate()
        .map_init(Vec::new, |ca, (g, x)| {
            let (head, mut tail, mut fwd) =
                x.ok_or_else(|| invalid("step part GPUs", g, "a GPU of some part"))?;
            tail.add_stream(&rg, &rt, None, dp_stream(g as u32), false, &mut fwd);
            tail.merge();
            Ok((head + tail.times(ca), fwd))
        })
        .collect::<Result<_>>()?;
    let sg = step_facts(cost1, map, batch, split, Graph::default());
    let trace = trace.map(|n| {
        compose(&map, spg, n, |gpu, k| {
            let sid = spg * gpu + k;
            let kind = rg.streams[sid as usize].kind;
            if kind == StreamKind::DpComm {
                let mut ev = Vec::new();
                stream_events(&rg, &rt, sid, map.place.node(gpu), sid, &mut ev);
                (kind, ev)
            } else {
                let ev = traced[gpu as usize].get_mut(k as usize).map(std::mem::take);
                (kind, ev.unwrap_or_default())
            }
        })
    });
    Ok(StepRun {
        report: report_of(&sg, measured, makespan, events, cost, env.step),
        trace,
    })
}

/// The GPU of op `op` of `g`.
fn gpu_of(g: &Graph, op: OpId) -> u32 {
    g.streams[g.ops[op as usize].stream as usize].gpu
}

/// What every part's sweep shares: the layout, the network, the all-reduces' graph `rg`,
/// per GPU its `t0` as in [`in_parts`], and how many GPUs are traced.
struct Swept<'a> {
    map: &'a RankMap,
    layout: &'a Layout,
    net: &'a dyn FixedDurations,
    rg: &'a Graph,
    t0: &'a [Ps],
    n_trace: u32,
}

impl Swept<'_> {
    /// Part `q` (emitted as `x`) swept alone and measured; `ext`: the all-reduces that
    /// wait for its ops, as (its op, all-reduce op).
    fn part(&self, x: Emitted, q: usize, ext: &[(OpId, OpId)]) -> Result<PartFacts> {
        let map = self.map;
        let Emitted {
            part: Part { b, streams, .. },
            ..
        } = x;
        let g = b.build()?;
        let within = Within {
            layout: self.layout,
            part: q,
            release: &[],
        };
        let t = run_dag_within(&g, self.net, within)?;
        let spg = map.streams_per_gpu();
        let n_local = streams.len() as u32 / spg;
        // Per GPU of the part: the earliest end among its bucket-ready ops.
        let mut first_ready = vec![Ps::MAX; n_local as usize];
        let mut ready = Vec::with_capacity(ext.len());
        for &(d, op) in ext {
            let end = t.end[d as usize];
            let l = (g.ops[d as usize].stream / spg) as usize;
            if streams[spg as usize * l] / spg != gpu_of(self.rg, op) {
                return Err(invalid(
                    format!("step part {q} all-reduce"),
                    op,
                    "an all-reduce part waiting for its own GPU's op",
                ));
            }
            first_ready[l] = first_ready[l].min(end);
            ready.push((op, end));
        }
        let (mut w, mut ca) = (GpuSpans::default(), Vec::new());
        let mut gpus = Vec::with_capacity(n_local as usize);
        let mut trace = Vec::new();
        for l in 0..n_local {
            let gpu = streams[(spg * l) as usize] / spg;
            let mut fwd = vec![(Ps::MAX, 0); map.par.ga as usize];
            w.clear();
            for k in 0..spg {
                w.add_stream(&g, &t, None, spg * l + k, k == 0, &mut fwd);
            }
            w.merge();
            let tail = w.cut_at(self.t0[gpu as usize].min(first_ready[l as usize]));
            gpus.push((gpu, w.times(&mut ca), tail, fwd));
            if gpu < self.n_trace {
                let node = map.place.node(gpu);
                let ev = (0..spg)
                    .map(|k| {
                        let mut ev = Vec::new();
                        stream_events(&g, &t, spg * l + k, node, spg * gpu + k, &mut ev);
                        ev
                    })
                    .collect();
                trace.push((gpu, ev));
            }
        }
        Ok(PartFacts {
            gpus,
            ready,
            trace,
            events: t.events,
            makespan: t.makespan,
        })
    }
}
