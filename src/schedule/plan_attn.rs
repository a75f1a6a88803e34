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
//!   `attn_bwd_flop_factor` / `attn_bwd_efficiency` (+ the forward again under
//!   recomputation), then runtime variance;
//! - **return** — the output transfers back to each unit's Q-home (in backward: dQ to the
//!   Q-home and dK/dV to the KV group's home, the Q and KV transfers reversed).
//!
//! In backward the executing worker is assumed to still hold the unit's Q, K, V and output
//! from the forward (or to recompute them there under full recomputation), so only dO
//! travels in and dQ, dK, dV travel back; the memory this takes is not modelled here.
//!
//! Chunks follow [`overlap_stages`]: dispatch chunk 0; then, stage by stage, dispatch
//! chunk m+1 and return chunk m−1 on the GPU's CP-communication stream while chunk m runs
//! on its compute stream. Dependencies only: a chunk's compute waits for its dispatch, its
//! return for its compute, the next linear block for the last return. Whether the
//! communication hides is what the engine measures.
//!
//! Transfers of one (group, chunk, phase) are one grouped all-to-all(v), as NCCL runs a
//! group of sends and receives: every worker of the group takes part and it ends when its
//! last transfer lands, so a unit waits for its inputs. The network models price
//! transfers without contention between them (analytical) or by fair sharing of links
//! (flow), so each GPU's traffic is aggregated onto its ports: one NVLink transfer of
//! max(egress, ingress) bytes to the next GPU of its node and one NIC transfer of
//! max(egress, ingress) bytes to its position in the next node (both permutations, so no
//! port receives two aggregates) — the per-port load that bounds an all-to-all(v).
//!
//! It may not price anything itself (bytes come from the Plan, whose bytes are
//! `cost::AttnShape`'s; times from `cost::CostModel`) and knows no scheme.

use super::stage::{AttentionStage, AttnCall, StepEnv};
use super::RankMap;
use crate::balance::libra::pipeliner::{overlap_stages, pipeline, Stage};
use crate::cost::{attn_segment_ps_f, CostModel};
use crate::engine::{GraphBuilder, OpClass, OpId, OpKind, OpLabel, StreamKind, Xfer};
use crate::error::{invalid, Result};
use crate::net::{GpuId, Ps};
use crate::plan::{Group, Plan, WorkUnit, WorkerId};

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

/// One chunk of one group, ready to emit for one pipeline stage.
#[derive(Clone, Debug, Default)]
struct ChunkOps {
    /// Per group worker: forward and backward kernel time (0 = no units).
    fwd: Vec<Ps>,
    bwd: Vec<Ps>,
    /// Aggregated port transfers (GPU ids of the stage): forward dispatch and return,
    /// backward dispatch and return.
    f_in: Vec<Xfer>,
    f_out: Vec<Xfer>,
    b_in: Vec<Xfer>,
    b_out: Vec<Xfer>,
}

/// One group for one pipeline stage.
#[derive(Clone, Debug)]
struct GroupOps {
    /// Worker ids (replica · CP + rank): the index into the builder's `last`.
    workers: Vec<WorkerId>,
    /// GPUs of the workers on this stage.
    gpus: Vec<GpuId>,
    chunks: Vec<ChunkOps>,
}

/// A Plan's attention as an [`AttentionStage`].
#[derive(Clone, Debug)]
pub struct PlanAttention {
    /// `[stage][ga]` → the groups at that GA index.
    ops: Vec<Vec<Vec<GroupOps>>>,
    chunks: u32,
    stages: Vec<Stage>,
}

impl PlanAttention {
    /// Lower `plan` for the ranks of `map`, cutting each worker's work into `chunks` equal
    /// head chunks (1 = no pipelining; must divide h_q/H). Plan worker w is rank
    /// (replica w / CP, position w mod CP) of every pipeline stage; its GA index is the
    /// micro-batch.
    pub fn new(cost: &CostModel, plan: &Plan, map: RankMap, chunks: u32) -> Result<Self> {
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
        let heads = w / chunks;
        let nworkers = par.dp * par.cp;
        // Backward as `CostModel::attn_bwd_ps` rounds it: fwd × factor / efficiency.
        let (bf, be) = (cost.hw.attn_bwd_flop_factor, cost.hw.attn_bwd_efficiency);
        let launch = cost.attn_launch_ps();
        // Scheme-level (stage-independent) part: per group, per chunk, per worker times
        // and the worker-level transfer pieces.
        struct Pre {
            ga: u32,
            workers: Vec<WorkerId>,
            fwd: Vec<Ps>,
            bwd: Vec<Ps>,
            /// Per chunk: (src, dst, bytes) dispatch and return pieces.
            disp: Vec<Vec<(WorkerId, WorkerId, u64)>>,
            ret: Vec<Vec<(WorkerId, WorkerId, u64)>>,
        }
        let mut pre: Vec<Pre> = Vec::with_capacity(plan.groups.len());
        for (gi, g) in plan.groups.iter().enumerate() {
            check_group(g, gi, nworkers, par.ga)?;
            let pipes = pipeline(plan, g, chunks)?;
            let mut t = vec![0.0f64; g.workers.len()];
            // A worker with units makes one kernel call per chunk (one launch overhead).
            let mut calls = vec![0.0f64; g.workers.len()];
            for u in &g.units {
                let i = g
                    .workers
                    .iter()
                    .position(|&x| x == u.worker)
                    .ok_or_else(|| {
                        invalid(
                            format!("plan group {gi} unit {} worker", u.id),
                            u.worker,
                            "a worker of its group",
                        )
                    })?;
                t[i] += unit_fwd_ps_f(cost, u, heads);
                calls[i] = 1.0;
            }
            let piece =
                |c: &crate::balance::libra::pipeliner::ChunkTransfer| (c.src, c.dst, c.bytes);
            let mut disp = vec![Vec::new(); chunks as usize];
            let mut ret = vec![Vec::new(); chunks as usize];
            for p in &pipes {
                for (k, c) in p.chunks.iter().enumerate() {
                    disp[k].extend(c.dispatch.iter().map(piece));
                    ret[k].extend(c.returns.iter().map(piece));
                }
            }
            pre.push(Pre {
                ga: g.ga,
                workers: g.workers.clone(),
                fwd: t
                    .iter()
                    .zip(&calls)
                    .map(|(&x, &n)| (x + n * launch).round() as Ps)
                    .collect(),
                bwd: t
                    .iter()
                    .zip(&calls)
                    .map(|(&x, &n)| (x * bf / be + n * launch).round() as Ps)
                    .collect(),
                disp,
                ret,
            });
        }
        let mut ops = Vec::with_capacity(par.pp as usize);
        for p in 0..par.pp {
            let base = p * nworkers;
            let gpu = |wk: WorkerId| base + wk;
            let mut by_ga: Vec<Vec<GroupOps>> = vec![Vec::new(); par.ga as usize];
            for g in &pre {
                let chunk_ops = (0..chunks as usize)
                    .map(|k| {
                        let rev = |v: &[(WorkerId, WorkerId, u64)]| -> Vec<(GpuId, GpuId, u64)> {
                            v.iter().map(|&(s, d, b)| (gpu(d), gpu(s), b)).collect()
                        };
                        let fwd_dir =
                            |v: &[(WorkerId, WorkerId, u64)]| -> Vec<(GpuId, GpuId, u64)> {
                                v.iter().map(|&(s, d, b)| (gpu(s), gpu(d), b)).collect()
                            };
                        ChunkOps {
                            fwd: g.fwd.clone(),
                            bwd: g.bwd.clone(),
                            f_in: port_xfers(&fwd_dir(&g.disp[k]), map),
                            f_out: port_xfers(&fwd_dir(&g.ret[k]), map),
                            // Backward: dO travels as the output did, reversed; dQ, dK, dV
                            // go home as Q and KV came.
                            b_in: port_xfers(&rev(&g.ret[k]), map),
                            b_out: port_xfers(&rev(&g.disp[k]), map),
                        }
                    })
                    .collect();
                by_ga[g.ga as usize].push(GroupOps {
                    workers: g.workers.clone(),
                    gpus: g.workers.iter().map(|&wk| gpu(wk)).collect(),
                    chunks: chunk_ops,
                });
            }
            ops.push(by_ga);
        }
        Ok(Self {
            ops,
            chunks,
            stages: overlap_stages(chunks),
        })
    }

    /// Head chunks per worker (M).
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
    // (gpu, intra out, intra in, inter out, inter in), sorted by gpu.
    let mut load: std::collections::BTreeMap<GpuId, [u64; 4]> = Default::default();
    for &(s, d, b) in pieces {
        if s == d || b == 0 {
            continue;
        }
        let intra = place.node(s) == place.node(d);
        let (o, i) = if intra { (0, 1) } else { (2, 3) };
        load.entry(s).or_default()[o] += b;
        load.entry(d).or_default()[i] += b;
    }
    let mut out = Vec::with_capacity(2 * load.len());
    for (&g, l) in &load {
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

/// No dependency for "none yet" (`OpId::MAX`), else the one op.
fn deps(op: &OpId) -> &[OpId] {
    if *op == OpId::MAX {
        &[]
    } else {
        std::slice::from_ref(op)
    }
}

impl AttentionStage for PlanAttention {
    fn emit(
        &mut self,
        b: &mut GraphBuilder,
        env: &StepEnv<'_>,
        call: AttnCall,
        last: &mut [OpId],
    ) -> Result<()> {
        let Some(groups) = self
            .ops
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
        for g in groups {
            let n = g.workers.len();
            if g.workers.iter().any(|&w| w as usize >= last.len()) {
                return Err(invalid(
                    "plan worker",
                    format!("{:?}", g.workers),
                    format!("worker ids below {}", last.len()),
                ));
            }
            // Per chunk and worker: the op its compute waits for, the op its return waits
            // for; the worker's latest communication op.
            let mut ready = vec![OpId::MAX; m * n];
            let mut done = vec![OpId::MAX; m * n];
            let mut tail: Vec<OpId> = g.workers.iter().map(|&w| last[w as usize]).collect();
            let mut comm_tail = vec![OpId::MAX; n];
            for st in &self.stages {
                if let Some(k) = st.dispatch {
                    let k = k as usize;
                    let c = &g.chunks[k];
                    let xf = if call.fwd { &c.f_in } else { &c.b_in };
                    if !xf.is_empty() {
                        let coll = b.add_collective(xf);
                        for i in 0..n {
                            let w = g.workers[i] as usize;
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
                        let w = g.workers[i] as usize;
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
                    let xf = if call.fwd { &c.f_out } else { &c.b_out };
                    if !xf.is_empty() {
                        let coll = b.add_collective(xf);
                        for i in 0..n {
                            let w = g.workers[i] as usize;
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
                            comm_tail[i] = op;
                        }
                    }
                }
            }
            // The next linear block runs on the compute stream (after every chunk's kernel
            // in issue order) and must wait for the last communication (the last return;
            // the CP stream runs in issue order).
            for i in 0..n {
                let w = g.workers[i] as usize;
                last[w] = if comm_tail[i] != OpId::MAX {
                    comm_tail[i]
                } else {
                    tail[i]
                };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
