//! A [`Plan`]'s core attention lowered onto the engine: the [`AttentionStage`] every
//! plan-writing scheme (Libra, WLB-LLM, DistCA, Ulysses as a Plan) runs through.
//!
//! Owns turning one layer of a Plan into ops: per group (GA index × pool), per head chunk
//! (Libra §6.2–6.3; M = 1 means no pipelining):
//! - **dispatch** — the Q and KV transfers that bring the chunk's inputs to the workers
//!   that compute it (in backward: the output gradients dO, the output transfers
//!   reversed);
//! - **compute** — each worker's units for the chunk's heads, one kernel op on its compute
//!   stream, priced through `cost/`: every unit segment (sample j, sample-local queries
//!   [a, e)) costs its exact causal FLOPs at the kernel efficiency the table gives for
//!   heads = heads per call, query length e − a and KV length e; backward ×
//!   `attn_bwd_flop_factor` / `attn_bwd_efficiency` or a calibrated backward table (+ the
//!   forward again under recomputation), then runtime variance; with a calibration's block
//!   models (`cost::blocks`) a worker's chunk is priced whole instead, as one forward launch
//!   and one backward call of thread blocks on the SMs;
//! - **return** — the output transfers back to each unit's Q-home (in backward: dQ to the
//!   Q-home and dK/dV to the KV group's home, the Q and KV transfers reversed).
//!
//! In backward the executing worker is assumed to still hold the unit's Q, K, V and output
//! from the forward (or to recompute them there under full recomputation), so only dO
//! travels in and dQ, dK, dV travel back; the memory this takes is not modelled here.
//!
//! A group's work is cut into slots ([`Overlap`]): Libra's M head chunks (every unit for
//! h_q/(H·M) heads, each transfer's share), or DistCA's two ping-pong nano-batches (each
//! nano-batch's own units for all heads and its own transfers, per the planner's
//! [`NanoTable`]). Slots follow [`overlap_stages`]: dispatch slot 0; then, stage by stage,
//! dispatch slot m+1 and return slot m−1 on the GPU's CP-communication stream while slot m
//! runs on its compute stream. Dependencies only: a slot's compute waits for its dispatch,
//! its return for its compute. Head chunks share one linear block: every dispatch waits for
//! it and the next one for the last return. Nano-batches each have their own linear block
//! (the step builder cuts it, [`AttentionStage::nanos`]): nano-batch k's dispatch waits only
//! for its own, so it runs under the other nano-batch's linear block, and its return gates
//! only its own next one. Whether the communication hides is what the engine measures.
//!
//! Transfers of one (group, slot, phase) are one grouped send/recv, as NCCL runs a group
//! of sends and receives ([`GraphBuilder::add_grouped_p2p`]): every worker of the group
//! takes part, a worker's transfers start once it and the workers it exchanges data with
//! have arrived, and it ends once its own and those peers' transfers have landed — so a
//! unit waits for its inputs, and a hot sender delays its receivers but not the rest of
//! a cluster-wide group (DistCA's). The network models price
//! transfers without contention between them (analytical) or by fair sharing of links
//! (flow), so each GPU's traffic is aggregated onto its ports: one NVLink transfer of
//! max(egress, ingress) bytes to the next GPU of its node and one NIC transfer of
//! max(egress, ingress) bytes to its position in the next node (both permutations, so no
//! port receives two aggregates) — the per-port load that bounds an all-to-all(v).
//!
//! It may not price anything itself (bytes come from the Plan, whose bytes are
//! `cost::AttnShape`'s; times from `cost::CostModel`) and knows no scheme.

use std::collections::HashMap;

use rayon::prelude::*;

use super::stage::{AttentionStage, AttnCall, StepEnv};
use super::RankMap;
use crate::balance::distca::pingpong::NanoTable;
use crate::balance::libra::pipeliner::{overlap_stages, pipeline, Stage};
use crate::cost::{attn_bwd_segment_ps_f, attn_segment_ps_f, CostModel};
use crate::engine::{GraphBuilder, OpClass, OpId, OpKind, OpLabel, StreamKind, Xfer};
use crate::error::{invalid, Result};
use crate::net::{GpuId, Ps};
use crate::plan::build::narrow;
use crate::plan::{Group, Payload, Plan, WorkUnit, WorkerId};

/// Forward time of one unit's causal attention over `heads` query heads per call, in ps
/// (unrounded): Σ over its segments of exact causal FLOPs / the table's TFLOP/s at
/// (heads, query length, KV length = causal prefix).
pub fn unit_fwd_ps_f(cost: &CostModel, unit: &WorkUnit, heads: u32) -> f64 {
    let a = cost.attn();
    unit.segments
        .iter()
        .map(|s| {
            attn_segment_ps_f(
                &cost.attn_eff,
                &a,
                heads,
                u64::from(s.start),
                u64::from(s.end),
            )
        })
        .sum()
}

/// Forward time of one worker's launch (unrounded ps) whose units the table prices at
/// `table_ps` (Σ [`unit_fwd_ps_f`]): with a calibrated block model, the makespan of the
/// launch's blocks (`CostModel::fwd_launch_ps_f`); without, `table_ps`.
pub fn launch_fwd_ps_f<'a>(
    cost: &CostModel,
    table_ps: f64,
    units: impl IntoIterator<Item = &'a WorkUnit>,
    heads: u32,
) -> f64 {
    cost.fwd_launch_ps_f(table_ps, heads, launch_segs(units))
}

/// Backward time of one worker's call (unrounded ps) whose units the backward table prices
/// at `table_ps` (Σ [`unit_bwd_ps_f`]): with a calibrated backward block model, the call's
/// kernels' blocks (`CostModel::bwd_launch_ps_f`); without, `table_ps`.
pub fn launch_bwd_ps_f<'a>(
    cost: &CostModel,
    table_ps: f64,
    units: impl IntoIterator<Item = &'a WorkUnit>,
    heads: u32,
) -> f64 {
    cost.bwd_launch_ps_f(table_ps, heads, launch_segs(units))
}

/// A launch's units as the block models' segments: (start, end, 1) per unit segment.
fn launch_segs<'a>(units: impl IntoIterator<Item = &'a WorkUnit>) -> Vec<(u64, u64, u32)> {
    units
        .into_iter()
        .flat_map(|u| u.segments.iter())
        .map(|s| (u64::from(s.start), u64::from(s.end), 1))
        .collect()
}

/// Backward time of one unit (unrounded ps), as [`unit_fwd_ps_f`] prices the forward:
/// through `cost::attn_bwd_segment_ps_f` (a calibration's backward table when there is one,
/// else the forward × factor / efficiency).
pub fn unit_bwd_ps_f(cost: &CostModel, unit: &WorkUnit, heads: u32) -> f64 {
    let a = cost.attn();
    unit.segments
        .iter()
        .map(|s| {
            attn_bwd_segment_ps_f(
                &cost.attn_eff,
                cost.attn_bwd_eff.as_ref(),
                &cost.hw,
                &a,
                heads,
                u64::from(s.start),
                u64::from(s.end),
            )
        })
        .sum()
}

/// One chunk of one group, ready to emit for one pipeline stage.
#[derive(Clone, Debug, Default)]
struct ChunkOps {
    /// Per group worker: forward and backward kernel time (0 = no units).
    fwd: Vec<Ps>,
    bwd: Vec<Ps>,
    /// Aggregated port transfers (GPU ids of the stage): forward dispatch and return. The
    /// backward's are the same lists: dO travels as the output did and dQ, dK, dV go home
    /// as Q and KV came, each reversed, and a port aggregate (max of egress and ingress
    /// per GPU) does not change when every piece is reversed.
    f_in: Vec<Xfer>,
    f_out: Vec<Xfer>,
    /// The GPU pairs that really exchange data in the dispatch (forward Q/KV, backward
    /// dQ/dK/dV) and in the return (forward output, backward dO): the coupling of the
    /// grouped send/recv, whose priced transfers are the port aggregates above.
    disp_pairs: Vec<(GpuId, GpuId)>,
    ret_pairs: Vec<(GpuId, GpuId)>,
}

/// One group for one pipeline stage.
#[derive(Clone, Debug)]
struct GroupOps {
    /// Per worker and TP lane (worker-major): (stage, the rank's offset in its stage) —
    /// the index into the builder's `last`.
    slots: Vec<(u32, u32)>,
    /// GPUs of the workers' lanes, as `slots`.
    gpus: Vec<GpuId>,
    chunks: Vec<ChunkOps>,
}

/// How a group's attention is cut into the slots the overlap schedule ([`overlap_stages`])
/// runs side by side on the compute and CP-communication streams.
#[derive(Clone, Copy, Debug)]
pub enum Overlap<'a> {
    /// M equal head chunks per worker (Libra's pipeliner, §6.2–6.3; 1 = no pipelining):
    /// every chunk carries all units for h_q/(H·M) heads and its share of every transfer.
    /// The linear blocks around the layer are whole.
    HeadChunks(u32),
    /// DistCA's ping-pong: the two nano-batches of a [`NanoTable`], each with all heads of
    /// its own units and its own transfers. The step builder splits every linear block
    /// into one op per nano-batch, so nano-batch k's dispatch waits only for its own
    /// linear block and overlaps the other's, and its return gates only its own next one.
    NanoBatches(&'a NanoTable),
}

/// A Plan's attention as an [`AttentionStage`].
#[derive(Clone, Debug)]
pub struct PlanAttention {
    /// `[mask class][stage][ga]` → the groups at that GA index.
    ops: Vec<Vec<Vec<Vec<GroupOps>>>>,
    /// The mask class of each layer (`CostModel::mask_classes` order).
    layer_class: Vec<usize>,
    /// Slots per group: head chunks (M) or nano-batches.
    chunks: u32,
    /// Nano-batches the step builder cuts linear blocks into (1 under head chunks).
    nanos: u32,
    /// Ranks per pipeline stage (DP · CP · TP): the stride of the builder's `last`.
    width: u32,
    /// Workers are GPUs of every stage (DistCA's ticks).
    pooled: bool,
    stages: Vec<Stage>,
    /// [`AttentionStage::emit`]'s per-group lists, kept between calls.
    scratch: EmitScratch,
}

/// Per slot and worker of a group: the op its compute waits for, the op its return waits
/// for, its return; per worker: its latest compute and communication op.
#[derive(Clone, Debug, Default)]
struct EmitScratch {
    ready: Vec<OpId>,
    done: Vec<OpId>,
    returned: Vec<OpId>,
    tail: Vec<OpId>,
    comm_tail: Vec<OpId>,
}

/// Per group, per slot and worker: forward time (unrounded) and whether it calls a kernel;
/// per slot: dispatch and return pieces (src, dst, bytes) in plan worker ids.
struct SlotWork {
    t: Vec<Vec<f64>>,
    /// Backward time, as `t`.
    tb: Vec<Vec<f64>>,
    calls: Vec<Vec<f64>>,
    disp: Vec<Vec<(WorkerId, WorkerId, u64)>>,
    ret: Vec<Vec<(WorkerId, WorkerId, u64)>>,
}

/// Each unit's position among its group's workers (the first, if one is listed twice),
/// or the named error of a unit on no worker of its group.
fn unit_workers(g: &Group, gi: usize) -> Result<Vec<usize>> {
    let mut at: HashMap<WorkerId, usize> = HashMap::with_capacity(g.workers.len());
    for (i, &w) in g.workers.iter().enumerate() {
        at.entry(w).or_insert(i);
    }
    g.units
        .iter()
        .map(|u| {
            at.get(&u.worker).copied().ok_or_else(|| {
                invalid(
                    format!("plan group {gi} unit {} worker", u.id),
                    u.worker,
                    "a worker of its group",
                )
            })
        })
        .collect()
}

/// Head chunks: every chunk computes every unit for `w / chunks` heads (the same time per
/// chunk) and moves its share of each transfer ([`pipeline`]).
fn head_chunk_work(
    cost: &CostModel,
    plan: &Plan,
    g: &Group,
    gi: usize,
    chunks: u32,
) -> Result<SlotWork> {
    let heads = plan.heads_per_shard() / chunks;
    let pipes = pipeline(plan, g, chunks)?;
    let n = g.workers.len();
    let mut t = vec![0.0f64; n];
    let mut tb = vec![0.0f64; n];
    // A worker with units makes one kernel call per chunk (one launch overhead).
    let mut calls = vec![0.0f64; n];
    // each worker's units, in plan order
    let mut mine: Vec<Vec<&WorkUnit>> = vec![Vec::new(); n];
    for (u, i) in g.units.iter().zip(unit_workers(g, gi)?) {
        t[i] += unit_fwd_ps_f(cost, u, heads);
        tb[i] += unit_bwd_ps_f(cost, u, heads);
        calls[i] = 1.0;
        mine[i].push(u);
    }
    // A worker's chunk is one forward launch and one backward call: block models price
    // them whole.
    if cost.attn_blocks.is_some() {
        for (ti, us) in t.iter_mut().zip(&mine) {
            *ti = launch_fwd_ps_f(cost, *ti, us.iter().copied(), heads);
        }
    }
    if cost.attn_bwd_blocks.is_some() {
        for (ti, us) in tb.iter_mut().zip(&mine) {
            *ti = launch_bwd_ps_f(cost, *ti, us.iter().copied(), heads);
        }
    }
    let piece = |c: &crate::balance::libra::pipeliner::ChunkTransfer| (c.src, c.dst, c.bytes);
    let mut disp = vec![Vec::new(); chunks as usize];
    let mut ret = vec![Vec::new(); chunks as usize];
    for p in &pipes {
        for (k, c) in p.chunks.iter().enumerate() {
            disp[k].extend(c.dispatch.iter().map(piece));
            ret[k].extend(c.returns.iter().map(piece));
        }
    }
    Ok(SlotWork {
        t: vec![t; chunks as usize],
        tb: vec![tb; chunks as usize],
        calls: vec![calls; chunks as usize],
        disp,
        ret,
    })
}

/// Nano-batches: slot k computes the units of nano-batch k for all `w` heads of their
/// shard and moves the transfers of nano-batch k whole (Q and KV in, outputs back).
fn nano_work(
    cost: &CostModel,
    plan: &Plan,
    g: &Group,
    gi: usize,
    table: &NanoTable,
) -> Result<SlotWork> {
    let heads = plan.heads_per_shard();
    let n = g.workers.len();
    let mut t = vec![vec![0.0f64; n]; 2];
    let mut tb = vec![vec![0.0f64; n]; 2];
    let mut calls = vec![vec![0.0f64; n]; 2];
    // each nano-batch's units of each worker, in plan order
    let mut mine: Vec<Vec<Vec<&WorkUnit>>> = vec![vec![Vec::new(); n]; 2];
    for (u, i) in g.units.iter().zip(unit_workers(g, gi)?) {
        let k = usize::from(table.unit_nano(gi, u.id));
        t[k][i] += unit_fwd_ps_f(cost, u, heads);
        tb[k][i] += unit_bwd_ps_f(cost, u, heads);
        calls[k][i] = 1.0;
        mine[k][i].push(u);
    }
    // A worker's nano-batch is one forward launch and one backward call: block models
    // price them whole.
    if cost.attn_blocks.is_some() {
        for (tk, mk) in t.iter_mut().zip(&mine) {
            for (ti, us) in tk.iter_mut().zip(mk) {
                *ti = launch_fwd_ps_f(cost, *ti, us.iter().copied(), heads);
            }
        }
    }
    if cost.attn_bwd_blocks.is_some() {
        for (tk, mk) in tb.iter_mut().zip(&mine) {
            for (ti, us) in tk.iter_mut().zip(mk) {
                *ti = launch_bwd_ps_f(cost, *ti, us.iter().copied(), heads);
            }
        }
    }
    let mut disp = vec![Vec::new(); 2];
    let mut ret = vec![Vec::new(); 2];
    for (tr, k) in g.transfers.iter().zip(table.transfer_nanos(gi, g)) {
        let piece = (tr.src, tr.dst, tr.bytes);
        match tr.carries {
            Payload::Output { .. } => ret[usize::from(k)].push(piece),
            Payload::Q { .. } | Payload::Kv { .. } => disp[usize::from(k)].push(piece),
        }
    }
    Ok(SlotWork {
        t,
        tb,
        calls,
        disp,
        ret,
    })
}

impl PlanAttention {
    /// Lower `plan` for the ranks of `map`, cut for overlap as `overlap` says (head chunks
    /// must divide h_q/H; a nano table must match the plan's groups). Plan worker w is
    /// rank (replica w / CP, position w mod CP) of every pipeline stage; its GA index is
    /// the micro-batch. Under TP the plan is one TP rank's (its shape is
    /// [`CostModel::tp_shard`]'s): every lane of the worker's TP group runs it on its own
    /// head shard, exchanging with the same lane of the other workers.
    pub fn new(cost: &CostModel, plan: &Plan, map: RankMap, overlap: Overlap<'_>) -> Result<Self> {
        Self::lower(cost, plan, map, overlap, false)
    }

    /// Lower a plan pooled across pipeline stages (DistCA's ticks, under
    /// `PipelineKind::Ticks`): plan worker w is GPU w (stage w / (DP·CP), rank w mod
    /// (DP·CP)), a group's GA index is the tick, and [`AttentionStage::emit`] is called once
    /// per (tick, layer j of every stage) with `last` spanning all stages.
    pub fn pooled(
        cost: &CostModel,
        plan: &Plan,
        map: RankMap,
        overlap: Overlap<'_>,
    ) -> Result<Self> {
        Self::lower(cost, plan, map, overlap, true)
    }

    /// One lowering per mask class of the model: the plan itself for the class of its own
    /// mask, its narrowing ([`narrow`]) for every narrower class; each layer then runs its
    /// class's.
    fn lower(
        cost: &CostModel,
        plan: &Plan,
        map: RankMap,
        overlap: Overlap<'_>,
        pooled: bool,
    ) -> Result<Self> {
        let par = map.par;
        let shard = cost.tp_shard(par.tp, par.ep)?;
        let m = &shard.model;
        let layer_class: Vec<usize> = (0..m.layers)
            .map(|l| m.attention.class_index(l, m.layers))
            .collect();
        if pooled {
            // a tick pools layer j of every stage: they must share a mask
            let per = (m.layers / par.pp.max(1)) as usize;
            if let Some(l) =
                (0..layer_class.len()).find(|&l| layer_class[l] != layer_class[l % per.max(1)])
            {
                return Err(invalid(
                    format!("model {}: attention", m.name),
                    format!("layer {l} of {} stages of {per} layers", par.pp),
                    "a pattern under which layer j of every pipeline stage has one mask (DistCA's \
                     ticks pool them)",
                ));
            }
        }
        let mut ops = Vec::new();
        let mut slots = (0, 0);
        for (mask, _, c) in shard.mask_classes() {
            let narrowed;
            let p = if mask == plan.shape.mask {
                plan
            } else {
                narrowed = narrow(plan, mask);
                &narrowed
            };
            let (o, chunks, nanos) = Self::lower_class(&c, p, map, overlap, pooled)?;
            ops.push(o);
            slots = (chunks, nanos);
        }
        Ok(Self {
            ops,
            layer_class,
            chunks: slots.0,
            nanos: slots.1,
            width: par.dp * par.cp * par.tp,
            pooled,
            stages: overlap_stages(slots.0),
            scratch: EmitScratch::default(),
        })
    }

    /// The ops of one mask class: `cost` is the class's (one TP rank's), `plan` its plan;
    /// returns them with the slots per group and the nano-batches.
    #[allow(clippy::type_complexity)]
    fn lower_class(
        cost: &CostModel,
        plan: &Plan,
        map: RankMap,
        overlap: Overlap<'_>,
        pooled: bool,
    ) -> Result<(Vec<Vec<Vec<GroupOps>>>, u32, u32)> {
        let par = map.par;
        let shape = cost.attn();
        if plan.shape != shape {
            return Err(invalid(
                "plan shape",
                format!("{:?}", plan.shape),
                format!("the model's attention shape {shape:?}"),
            ));
        }
        let w = plan.heads_per_shard();
        let (chunks, nanos) = match overlap {
            Overlap::HeadChunks(chunks) => {
                if w == 0 || chunks == 0 || w % chunks != 0 {
                    return Err(invalid(
                        "M (pipeliner chunks)",
                        chunks,
                        format!(
                            "a divisor of h_q/H = {}/{} = {w}",
                            shape.heads_q, plan.head_shards
                        ),
                    ));
                }
                (chunks, 1)
            }
            Overlap::NanoBatches(table) => {
                table.validate(plan)?;
                (2, 2)
            }
        };
        let nworkers = par.dp * par.cp;
        // Per call: the forward's and the backward's fixed cost (as `CostModel` prices them).
        let (launch, bwd_launch) = (cost.attn_launch_ps(), cost.attn_bwd_launch_ps());
        // Scheme-level (stage-independent) part: per group, per slot and worker, times and
        // the worker-level transfer pieces.
        struct Pre {
            ga: u32,
            workers: Vec<WorkerId>,
            fwd: Vec<Vec<Ps>>,
            bwd: Vec<Vec<Ps>>,
            disp: Vec<Vec<(WorkerId, WorkerId, u64)>>,
            ret: Vec<Vec<(WorkerId, WorkerId, u64)>>,
        }
        // Groups are lowered in parallel, gathered in order (the first error in order is
        // the one returned).
        let pre: Vec<Result<Pre>> = plan
            .groups
            .par_iter()
            .enumerate()
            .map(|(gi, g)| -> Result<Pre> {
                if pooled {
                    check_group(g, gi, nworkers * par.pp, 2 * (par.ga + par.pp - 1))?;
                } else {
                    check_group(g, gi, nworkers, par.ga)?;
                }
                let sw = match overlap {
                    Overlap::HeadChunks(m) => head_chunk_work(cost, plan, g, gi, m)?,
                    Overlap::NanoBatches(table) => nano_work(cost, plan, g, gi, table)?,
                };
                let times = |t: &[Vec<f64>], launch: f64| -> Vec<Vec<Ps>> {
                    t.iter()
                        .zip(&sw.calls)
                        .map(|(t, c)| {
                            t.iter()
                                .zip(c)
                                .map(|(&x, &n)| (x + n * launch).round() as Ps)
                                .collect()
                        })
                        .collect()
                };
                Ok(Pre {
                    ga: g.ga,
                    workers: g.workers.clone(),
                    fwd: times(&sw.t, launch),
                    bwd: times(&sw.tb, bwd_launch),
                    disp: sw.disp,
                    ret: sw.ret,
                })
            })
            .collect();
        let pre: Vec<Pre> = pre.into_iter().collect::<Result<_>>()?;
        // Pooled: one lowering whose workers are GPUs, indexed by tick; else one per stage.
        let (lowerings, slots) = if pooled {
            (1, 2 * (par.ga + par.pp - 1))
        } else {
            (par.pp, par.ga)
        };
        let tp = par.tp;
        let lanes = |v: &[Ps]| -> Vec<Ps> {
            v.iter()
                .flat_map(|&x| std::iter::repeat_n(x, tp as usize))
                .collect()
        };
        let mut ops = Vec::with_capacity(lowerings as usize);
        for p in 0..lowerings {
            let base = p * nworkers;
            // Lane t of worker wk: the builder's rank offset (base + wk) · TP + t.
            let gpu = |wk: WorkerId, t: u32| (base + wk) * tp + t;
            let pieces = |v: &[(WorkerId, WorkerId, u64)]| -> Vec<(GpuId, GpuId, u64)> {
                v.iter()
                    .flat_map(|&(s, d, b)| (0..tp).map(move |t| (gpu(s, t), gpu(d, t), b)))
                    .collect()
            };
            let lowered: Vec<GroupOps> = pre
                .par_iter()
                .map(|g| {
                    let chunk_ops = (0..chunks as usize)
                        .map(|k| {
                            let (disp, ret) = (pieces(&g.disp[k]), pieces(&g.ret[k]));
                            ChunkOps {
                                fwd: lanes(&g.fwd[k]),
                                bwd: lanes(&g.bwd[k]),
                                f_in: port_xfers(&disp, map),
                                f_out: port_xfers(&ret, map),
                                disp_pairs: peer_pairs(&disp),
                                ret_pairs: peer_pairs(&ret),
                            }
                        })
                        .collect();
                    let ranks = nworkers * tp;
                    let mut slots_of = Vec::with_capacity(g.workers.len() * tp as usize);
                    let mut gpus = Vec::with_capacity(slots_of.capacity());
                    for &wk in &g.workers {
                        for t in 0..tp {
                            let off = wk * tp + t;
                            slots_of.push((off / ranks, off % ranks));
                            gpus.push(gpu(wk, t));
                        }
                    }
                    GroupOps {
                        slots: slots_of,
                        gpus,
                        chunks: chunk_ops,
                    }
                })
                .collect();
            let mut by_ga: Vec<Vec<GroupOps>> = vec![Vec::new(); slots as usize];
            for (g, ops) in pre.iter().zip(lowered) {
                by_ga[g.ga as usize].push(ops);
            }
            ops.push(by_ga);
        }
        Ok((ops, chunks, nanos))
    }

    /// Overlap slots per group (head chunks M, or 2 nano-batches).
    pub fn chunks(&self) -> u32 {
        self.chunks
    }
}

fn check_group(g: &Group, gi: usize, nworkers: u32, ga: u32) -> Result<()> {
    if g.ga >= ga {
        return Err(invalid(
            format!("plan group {gi} ga"),
            g.ga,
            format!("a GA index below the step's ga = {ga}"),
        ));
    }
    if let Some(&w) = g.workers.iter().find(|&&w| w >= nworkers) {
        return Err(invalid(
            format!("plan group {gi} worker"),
            w,
            format!("a worker id below dp × cp = {nworkers}"),
        ));
    }
    Ok(())
}

/// Aggregate point-to-point pieces (GPU ids) onto each GPU's ports: per GPU, one NVLink
/// transfer of max(egress, ingress) same-node bytes to the next GPU of its node and one
/// NIC transfer of max(egress, ingress) cross-node bytes to its position in the next node.
/// Pieces with `src == dst` move nothing. Output is ordered by GPU.
fn port_xfers(pieces: &[(GpuId, GpuId, u64)], map: RankMap) -> Vec<Xfer> {
    let place = map.place;
    let gpn = place.gpus_per_node.max(1);
    // (gpu, which of intra out, intra in, inter out, inter in, bytes), then summed per
    // (gpu, which) in GPU order.
    let mut ends: Vec<(GpuId, u8, u64)> = Vec::with_capacity(2 * pieces.len());
    for &(s, d, b) in pieces {
        if s == d || b == 0 {
            continue;
        }
        let o = if place.node(s) == place.node(d) { 0 } else { 2 };
        ends.push((s, o, b));
        ends.push((d, o + 1, b));
    }
    ends.sort_unstable_by_key(|&(g, w, _)| (g, w));
    let mut load: Vec<(GpuId, [u64; 4])> = Vec::new();
    for (g, w, b) in ends {
        if load.last().is_none_or(|l| l.0 != g) {
            load.push((g, [0; 4]));
        }
        if let Some(l) = load.last_mut() {
            l.1[usize::from(w)] += b;
        }
    }
    let mut out = Vec::with_capacity(2 * load.len());
    for &(g, l) in &load {
        let (node, pos) = (g / gpn, g % gpn);
        let intra = l[0].max(l[1]);
        if intra > 0 {
            out.push(Xfer {
                src: g,
                dst: node * gpn + (pos + 1) % gpn,
                bytes: intra,
            });
        }
        let inter = l[2].max(l[3]);
        if inter > 0 {
            let nodes = place.nodes.max(1);
            out.push(Xfer {
                src: g,
                dst: ((node + 1) % nodes) * gpn + pos,
                bytes: inter,
            });
        }
    }
    out
}

/// The distinct GPU pairs (smaller id first) that move bytes among `pieces`.
fn peer_pairs(pieces: &[(GpuId, GpuId, u64)]) -> Vec<(GpuId, GpuId)> {
    let mut v: Vec<(GpuId, GpuId)> = pieces
        .iter()
        .filter(|&&(s, d, b)| s != d && b > 0)
        .map(|&(s, d, _)| (s.min(d), s.max(d)))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// No dependency for "none yet" (`OpId::MAX`), else the one op.
fn deps(op: &OpId) -> &[OpId] {
    if *op == OpId::MAX {
        &[]
    } else {
        std::slice::from_ref(op)
    }
}

impl AttentionStage for PlanAttention {
    fn nanos(&self) -> u32 {
        self.nanos
    }

    fn pooled(&self) -> bool {
        self.pooled
    }

    fn emit(
        &mut self,
        b: &mut GraphBuilder,
        env: &StepEnv<'_>,
        call: AttnCall,
        last: &mut [OpId],
    ) -> Result<()> {
        let class = self
            .layer_class
            .get(call.layer as usize)
            .copied()
            .unwrap_or(0);
        let Some(groups) = self.ops[class]
            .get(call.stage as usize)
            .and_then(|s| s.get(call.mb as usize))
        else {
            return Err(invalid(
                "attention call",
                format!("stage {} micro-batch {}", call.stage, call.mb),
                "a stage and GA index of the lowered plan",
            ));
        };
        let (c_in, c_out, c_attn) = if call.fwd {
            (OpClass::A2aIn, OpClass::A2aOut, OpClass::AttnFwd)
        } else {
            (OpClass::A2aOut, OpClass::A2aIn, OpClass::AttnBwd)
        };
        let lab = |class| OpLabel {
            class,
            mb: call.mb as u16,
            layer: call.layer as u16,
        };
        let m = self.chunks as usize;
        let nano = self.nanos > 1;
        // `last` holds one entry per (stage, nano-batch, rank): the rank at offset `off` of
        // stage s (stage 0 unless pooled), nano-batch k at (s · nanos + k) · W + off. Under
        // nano-batches slot k waits for and gates nano-batch k's linear blocks; head chunks
        // all wait for and gate the one linear block.
        let (width, nanos) = (self.width as usize, self.nanos as usize);
        let slot_of = |k: usize, (s, off): (u32, u32)| {
            let k = if nano { k } else { 0 };
            (s as usize * nanos + k) * width + off as usize
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        for g in groups {
            let n = g.slots.len();
            if g.slots.iter().any(|&w| slot_of(nanos - 1, w) >= last.len()) {
                return Err(invalid(
                    "plan worker",
                    format!("{:?}", g.slots),
                    format!("worker ids within the builder's {} entries", last.len()),
                ));
            }
            let EmitScratch {
                ready,
                done,
                returned,
                tail,
                comm_tail,
            } = &mut scratch;
            for v in [&mut *ready, &mut *done, &mut *returned] {
                v.clear();
                v.resize(m * n, OpId::MAX);
            }
            tail.clear();
            tail.extend(g.slots.iter().map(|&w| last[slot_of(0, w)]));
            comm_tail.clear();
            comm_tail.resize(n, OpId::MAX);
            for st in &self.stages {
                if let Some(k) = st.dispatch {
                    let k = k as usize;
                    let c = &g.chunks[k];
                    let (xf, pairs) = if call.fwd {
                        (&c.f_in, &c.disp_pairs)
                    } else {
                        (&c.f_out, &c.ret_pairs)
                    };
                    if !xf.is_empty() {
                        let coll = b.add_grouped_p2p(xf, pairs);
                        for i in 0..n {
                            let w = slot_of(k, g.slots[i]);
                            let op = b.add_op(
                                env.stream(g.gpus[i], StreamKind::CpComm),
                                OpKind::Coll(coll),
                                lab(c_in),
                                deps(&last[w]),
                            );
                            ready[k * n + i] = op;
                            comm_tail[i] = op;
                        }
                    }
                }
                if let Some(k) = st.compute {
                    let k = k as usize;
                    let c = &g.chunks[k];
                    for i in 0..n {
                        let base = if call.fwd {
                            c.fwd[i]
                        } else {
                            c.bwd[i] + if call.recompute { c.fwd[i] } else { 0 }
                        };
                        if base == 0 {
                            done[k * n + i] = ready[k * n + i];
                            continue;
                        }
                        let w = slot_of(k, g.slots[i]);
                        let dep = if ready[k * n + i] == OpId::MAX {
                            &last[w]
                        } else {
                            &ready[k * n + i]
                        };
                        let dur = env.vary(g.gpus[i], call.layer, c_attn, call.mb, base);
                        let op = b.add_op(
                            env.stream(g.gpus[i], StreamKind::Compute),
                            OpKind::Compute(dur),
                            lab(c_attn),
                            deps(dep),
                        );
                        done[k * n + i] = op;
                        tail[i] = op;
                    }
                }
                if let Some(k) = st.ret {
                    let k = k as usize;
                    let c = &g.chunks[k];
                    let (xf, pairs) = if call.fwd {
                        (&c.f_out, &c.ret_pairs)
                    } else {
                        (&c.f_in, &c.disp_pairs)
                    };
                    if !xf.is_empty() {
                        let coll = b.add_grouped_p2p(xf, pairs);
                        for i in 0..n {
                            let w = slot_of(k, g.slots[i]);
                            let dep = if done[k * n + i] == OpId::MAX {
                                &last[w]
                            } else {
                                &done[k * n + i]
                            };
                            let op = b.add_op(
                                env.stream(g.gpus[i], StreamKind::CpComm),
                                OpKind::Coll(coll),
                                lab(c_out),
                                deps(dep),
                            );
                            returned[k * n + i] = op;
                            comm_tail[i] = op;
                        }
                    }
                }
            }
            for i in 0..n {
                let w = g.slots[i];
                if nano {
                    // Nano-batch k's next linear block waits for its own return (or, with
                    // nothing to return, its kernel or its dispatch).
                    for k in 0..m {
                        let j = k * n + i;
                        let op = [returned[j], done[j], ready[j]]
                            .into_iter()
                            .find(|&op| op != OpId::MAX);
                        if let Some(op) = op {
                            last[slot_of(k, w)] = op;
                        }
                    }
                } else {
                    // The next linear block runs on the compute stream (after every
                    // chunk's kernel in issue order) and must wait for the last
                    // communication (the last return; the CP stream runs in issue order).
                    last[slot_of(0, w)] = if comm_tail[i] != OpId::MAX {
                        comm_tail[i]
                    } else {
                        tail[i]
                    };
                }
            }
        }
        self.scratch = scratch;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
