//! DeepSpeed-Ulysses context parallelism, lowered to an engine op graph for one training
//! step of DP × PP × CP with GA micro-batches.
//!
//! Per layer and micro-batch on each rank of a CP group (Jacobs et al., "DeepSpeed
//! Ulysses", 2023, §3): the rank holds L/CP tokens of the packed sequence with all heads;
//! an all-to-all of Q/K/V gives it all L tokens for h_q/CP query heads (and
//! max(1, h_kv/CP) KV heads: KV heads are replicated when CP exceeds h_kv); it runs core
//! attention over every document of the sequence for its heads; an all-to-all of the
//! output gives the tokens back. Backward mirrors it (dO out, dQ/dK/dV back). Head counts
//! that do not divide are rejected.
//!
//! Every rank of a CP group computes the same attention FLOPs (heads split evenly), so
//! Ulysses balances *within* a CP group; different replicas get different packed
//! sequences, and that cross-replica skew waits at the DP gradient all-reduce.
//!
//! Collectives are lowered to point-to-point transfers the network model prices, all
//! started together when the last rank arrives:
//! - the DP gradient all-reduce as the cluster's collective model lowers it
//!   (`net::collective::CollectiveModel`: NCCL's ring, NVLS or tree, and its latency);
//! - all-to-all on a node-aligned group (whole blocks of consecutive ranks per node, as the
//!   placement makes them): each rank sends one aggregate over NVLink (the bytes for all
//!   same-node peers, to the next rank of its node) and one over its NIC (the bytes for all
//!   remote peers, to the rank at its position in the next node) — the per-GPU egress that
//!   bounds an all-to-all on a non-blocking fabric, with destinations that are permutations
//!   so no port receives two aggregates; other groups send to their first same-node and
//!   first remote peer.
//!
//! Recomputation adds each layer's forward compute to its backward compute (the
//! all-to-alls are not repeated). Embedding lookup and the optimizer step are not priced.

use super::stage::{AttentionStage, AttnCall, StepEnv};
use super::{Coords, PipelineKind, RankMap, RuntimeVariance};
use crate::cost::memory::{rank_memory, stage_grad_bytes, MemoryBreakdown, MemoryInputs};
use crate::cost::{CostModel, LinearPart};
use crate::engine::{
    CollId, Graph, GraphBuilder, OpClass, OpId, OpKind, OpLabel, StreamId, StreamKind, Xfer,
};
use crate::error::{invalid, Result};
use crate::net::collective::{node_blocks, CollOp};
use crate::net::{GpuId, Ps};
use crate::workload::PackedSeq;

pub use crate::cost::{head_split, HeadSplit};

/// One step's graph with what the report needs to read it.
#[derive(Clone, Debug)]
pub struct StepGraph {
    /// The op graph.
    pub graph: Graph,
    /// The rank layout.
    pub map: RankMap,
    /// Non-padding tokens in the step.
    pub tokens: u64,
    /// Causal query–key pairs in the step.
    pub causal_pairs: u64,
    /// Per-rank peak memory, by GPU.
    pub memory: Vec<MemoryBreakdown>,
    /// Stream ids of each GPU: `[compute, cp, pp, dp]` at `4·gpu + k`.
    pub streams_per_gpu: u32,
}

/// The first and last layer (inclusive start, exclusive end) of each stage: layers split
/// as evenly as possible, earlier stages taking the remainder.
pub fn stage_layers(layers: u32, pp: u32) -> Vec<(u32, u32)> {
    let (base, rem) = (layers / pp, layers % pp);
    let mut out = Vec::with_capacity(pp as usize);
    let mut a = 0;
    for s in 0..pp {
        let n = base + u32::from(s < rem);
        out.push((a, a + n));
        a += n;
    }
    out
}

/// The order of forward (true) and backward (false) micro-batch slots on `stage`.
pub fn stage_order(kind: PipelineKind, pp: u32, stage: u32, ga: u32) -> Vec<(bool, u32)> {
    let mut v = Vec::with_capacity(2 * ga as usize);
    match kind {
        PipelineKind::Gpipe => {
            v.extend((0..ga).map(|m| (true, m)));
            v.extend((0..ga).map(|m| (false, m)));
        }
        PipelineKind::OneFOneB => {
            let w = (pp - stage - 1).min(ga);
            v.extend((0..w).map(|m| (true, m)));
            for i in 0..ga - w {
                v.push((true, w + i));
                v.push((false, i));
            }
            v.extend((ga - w..ga).map(|m| (false, m)));
        }
        PipelineKind::Ticks => {
            use crate::balance::distca::pingpong::{pp_ticks, Phase};
            for t in pp_ticks(pp, ga).unwrap_or_default() {
                if let Some(Some(mb)) = t.stages.get(stage as usize) {
                    v.push((t.phase == Phase::Forward, *mb));
                }
            }
        }
    }
    v
}

/// Micro-batches whose activations a stage holds at its peak.
pub fn in_flight(kind: PipelineKind, pp: u32, stage: u32, ga: u32) -> u32 {
    match kind {
        PipelineKind::Gpipe => ga,
        PipelineKind::OneFOneB => (pp - stage).min(ga),
        // The most forwards not yet matched by their backward along the stage's order.
        PipelineKind::Ticks => stage_order(kind, pp, stage, ga)
            .iter()
            .scan(0i64, |n, &(fwd, _)| {
                *n += if fwd { 1 } else { -1 };
                Some(*n)
            })
            .max()
            .unwrap_or(0) as u32,
    }
}

/// Tokens of chunk `c` when `tokens` are cut into `n` contiguous chunks (sizes differ by
/// at most one).
fn chunk(tokens: u64, n: u32, c: u32) -> u64 {
    let n = u64::from(n);
    tokens / n + u64::from(u64::from(c) < tokens % n)
}

/// Base durations of one rank's work for one micro-batch (before variance).
#[derive(Clone, Copy, Default)]
struct RankDur {
    pre_f: Ps,
    post_f: Ps,
    pre_b: Ps,
    post_b: Ps,
    head_f: Ps,
    head_b: Ps,
}

struct Ctx<'a> {
    map: RankMap,
    var: &'a dyn RuntimeVariance,
    step: u64,
    /// The micro-batch whose ops are being emitted (for the variance draw).
    mb: u32,
    b: GraphBuilder,
    xf: Vec<Xfer>,
}

impl Ctx<'_> {
    fn stream(&self, gpu: GpuId, k: StreamKind) -> StreamId {
        4 * gpu + k as u32
    }

    /// A kernel of `dur` on `gpu`'s compute stream after `deps`.
    fn compute(&mut self, gpu: GpuId, dur: Ps, label: OpLabel, deps: &[OpId]) -> OpId {
        let s = self.stream(gpu, StreamKind::Compute);
        self.b.add_op(s, OpKind::Compute(dur), label, deps)
    }

    fn vary(&self, gpu: GpuId, layer: u32, class: OpClass, base: Ps) -> Ps {
        let f = self
            .var
            .kernel_factor(gpu, self.step, layer, class, self.mb)
            * self.var.persistent_factor(gpu);
        if f == 1.0 {
            base
        } else {
            (base as f64 * f.max(0.0)).round() as Ps
        }
    }

    /// The all-to-all pattern of a group: for each rank, (same-node peer, how many
    /// same-node peers, remote peer, how many remote peers). On a node-aligned group the
    /// peers are permutations (next rank in the node; same position in the next node), so
    /// no NIC or NVLink port receives more than one aggregate.
    fn a2a_pattern(&self, gpus: &[GpuId], out: &mut Vec<A2aRoute>) {
        out.clear();
        let n = gpus.len();
        let place = self.map.place;
        if let Some((nodes, per_node)) = node_blocks(gpus, place.gpus_per_node) {
            for (i, &src) in gpus.iter().enumerate() {
                let (k, j) = (i / per_node, i % per_node);
                let intra = gpus[k * per_node + (j + 1) % per_node];
                let inter = gpus[((k + 1) % nodes) * per_node + j];
                out.push(A2aRoute {
                    src,
                    d_in: intra,
                    n_in: (per_node - 1) as u64,
                    d_out: inter,
                    n_out: (n - per_node) as u64,
                });
            }
            return;
        }
        for (i, &src) in gpus.iter().enumerate() {
            let node = place.node(src);
            let mut r = A2aRoute {
                src,
                d_in: src,
                n_in: 0,
                d_out: src,
                n_out: 0,
            };
            for k in 1..n {
                let dst = gpus[(i + k) % n];
                if place.node(dst) == node {
                    if r.n_in == 0 {
                        r.d_in = dst;
                    }
                    r.n_in += 1;
                } else {
                    if r.n_out == 0 {
                        r.d_out = dst;
                    }
                    r.n_out += 1;
                }
            }
            out.push(r);
        }
    }

    /// An all-to-all over a group (its `routes`) where rank i sends `pair_bytes[i]` to
    /// every peer.
    fn all_to_all(&mut self, routes: &[A2aRoute], pair_bytes: &[u64]) -> CollId {
        self.xf.clear();
        for (r, &b) in routes.iter().zip(pair_bytes) {
            if r.n_in > 0 {
                self.xf.push(Xfer {
                    src: r.src,
                    dst: r.d_in,
                    bytes: r.n_in * b,
                });
            }
            if r.n_out > 0 {
                self.xf.push(Xfer {
                    src: r.src,
                    dst: r.d_out,
                    bytes: r.n_out * b,
                });
            }
        }
        let xf = std::mem::take(&mut self.xf);
        let c = self.b.add_collective(&xf);
        self.xf = xf;
        c
    }

    /// The all-reduce of `bytes` over `gpus`, lowered by the cluster's collective model.
    fn all_reduce(&mut self, gpus: &[GpuId], bytes: u64) -> CollId {
        let place = self.map.place;
        let lw = place
            .coll
            .lower(CollOp::AllReduce, gpus, bytes, place.gpus_per_node);
        self.xf.clear();
        self.xf.extend(lw.xfers.iter().map(|t| Xfer {
            src: t.src,
            dst: t.dst,
            bytes: t.bytes,
        }));
        let xf = std::mem::take(&mut self.xf);
        let c = self.b.add_collective_with_latency(&xf, lw.latency);
        self.xf = xf;
        c
    }
}

const NONE: OpId = OpId::MAX;

/// How one rank's all-to-all traffic is aggregated.
#[derive(Clone, Copy, Debug)]
struct A2aRoute {
    src: GpuId,
    d_in: GpuId,
    n_in: u64,
    d_out: GpuId,
    n_out: u64,
}

/// Build one training step: `batch[r][m]` is replica r's micro-batch m (one packed
/// sequence per CP group per micro-batch).
pub fn build_step(
    cost: &CostModel,
    map: RankMap,
    batch: &[Vec<PackedSeq>],
    step: u64,
    var: &dyn RuntimeVariance,
) -> Result<StepGraph> {
    build_step_with(cost, map, batch, step, var, None)
}

/// [`build_step`] with the core attention of every layer handed to `attn` (a
/// [`crate::schedule::stage::AttentionStage`], e.g. a lowered Plan) instead of Ulysses'
/// all-to-alls; linear blocks, pipeline sends, GA and the DP all-reduce are the same.
/// `batch[r][m]` still gives replica r's tokens (the linear work of its CP ranks).
pub fn build_step_with(
    cost: &CostModel,
    map: RankMap,
    batch: &[Vec<PackedSeq>],
    step: u64,
    var: &dyn RuntimeVariance,
    mut attn: Option<&mut dyn AttentionStage>,
) -> Result<StepGraph> {
    let par = map.par;
    let m = &cost.model;
    let split = match (&attn, head_split(m.heads_q, m.heads_kv, par.cp)) {
        (_, Ok(s)) => s,
        (None, Err(e)) => return Err(e),
        // A plugged stage splits work its own way; memory is estimated at Ulysses' share.
        (Some(_), Err(_)) => HeadSplit {
            q: m.heads_q.div_ceil(par.cp),
            kv: m.heads_kv.div_ceil(par.cp).max(1),
        },
    };
    let env = StepEnv { map, var, step };
    // Nano-batches per micro-batch: each rank's linear blocks are cut into this many ops.
    let nanos = attn.as_deref().map_or(1, |a| a.nanos()).max(1) as usize;
    if batch.len() != par.dp as usize {
        return Err(invalid(
            "batch replicas",
            batch.len(),
            format!("dp = {}", par.dp),
        ));
    }
    for (r, mbs) in batch.iter().enumerate() {
        if mbs.len() != par.ga as usize {
            return Err(invalid(
                format!("batch replica {r} micro-batches"),
                mbs.len(),
                format!("ga = {}", par.ga),
            ));
        }
    }
    if par.pp > m.layers {
        return Err(invalid(
            "pp",
            par.pp,
            format!("at most the model's {} layers", m.layers),
        ));
    }
    if par.pipeline == PipelineKind::Ticks && m.layers % par.pp != 0 {
        return Err(invalid(
            "pp",
            par.pp,
            format!(
                "a divisor of the model's {} layers (the tick schedule runs layer j of every stage together)",
                m.layers
            ),
        ));
    }
    let mut e = Emitter::new(cost, map, batch, var, step, split, nanos);
    match par.pipeline {
        PipelineKind::Gpipe | PipelineKind::OneFOneB => {
            for p in 0..par.pp {
                for (fwd, mb) in stage_order(par.pipeline, par.pp, p, par.ga) {
                    e.slot(p, fwd, mb, reborrow(&mut attn), &env)?;
                }
                e.dp_allreduce(p);
            }
        }
        PipelineKind::Ticks => {
            let ticks = crate::balance::distca::pingpong::pp_ticks(par.pp, par.ga)?;
            for (ti, tick) in ticks.iter().enumerate() {
                e.tick(ti as u32, tick, reborrow(&mut attn), &env)?;
            }
            for p in 0..par.pp {
                e.dp_allreduce(p);
            }
        }
    }
    e.finish()
}

/// A shorter-lived handle on the plugged stage, for one driver call.
fn reborrow<'s>(
    attn: &'s mut Option<&mut dyn AttentionStage>,
) -> Option<&'s mut dyn AttentionStage> {
    match attn {
        Some(a) => Some(&mut **a),
        None => None,
    }
}

/// One pipeline stage's emission state.
struct StageState {
    /// Layers [lf, ll).
    lf: u32,
    ll: u32,
    /// Gradient buckets of the stage.
    nb: u32,
    /// The micro-batch of the stage's last backward slot (its gradients are then final).
    last_bwd_mb: Option<u32>,
    /// GPU of each rank (replica · CP + position).
    groups: Vec<GpuId>,
    /// All-to-all routes of each rank (Ulysses' built-in attention).
    routes: Vec<A2aRoute>,
    /// Per (nano-batch k, rank i) at k·W + i: linear durations of the current slot.
    durs: Vec<RankDur>,
    /// Per rank: Ulysses all-to-all bytes to each peer, in and out.
    pair_in: Vec<u64>,
    pair_out: Vec<u64>,
    /// Per replica: Ulysses attention time, forward and backward, and its tokens.
    attn_f: Vec<Ps>,
    attn_b: Vec<Ps>,
    tokens: Vec<u64>,
    /// Per (rank, bucket): the op after which the bucket's gradients are ready.
    bucket_ready: Vec<OpId>,
}

/// Emits a step's ops slot by slot and layer by layer; the drivers in
/// [`build_step_with`] choose the order (stage by stage, or tick by tick).
struct Emitter<'a> {
    cx: Ctx<'a>,
    cost: &'a CostModel,
    batch: &'a [Vec<PackedSeq>],
    split: HeadSplit,
    nanos: usize,
    /// Ranks per stage (DP · CP).
    wn: usize,
    stages: Vec<StageState>,
    /// Per stage, nano-batch and rank at (p · nanos + k) · W + i: the rank's last op (the
    /// op its next linear block waits for).
    last: Vec<OpId>,
    /// Per (stage, replica, cp, mb): the first op of each slot and its send, for PP edges.
    f_first: Vec<OpId>,
    f_send: Vec<OpId>,
    b_first: Vec<OpId>,
    b_send: Vec<OpId>,
}

impl<'a> Emitter<'a> {
    fn new(
        cost: &'a CostModel,
        map: RankMap,
        batch: &'a [Vec<PackedSeq>],
        var: &'a dyn RuntimeVariance,
        step: u64,
        split: HeadSplit,
        nanos: usize,
    ) -> Self {
        let par = map.par;
        let m = &cost.model;
        let (dp, pp, cp, ga) = (par.dp, par.pp, par.cp, par.ga);
        let gpus = map.gpus();
        let ops_est =
            gpus as usize * ga as usize * (m.layers as usize / pp as usize + 1) * 8 * nanos + 16;
        let mut cx = Ctx {
            map,
            mb: 0,
            var,
            step,
            b: GraphBuilder::with_capacity(ops_est),
            xf: Vec::new(),
        };
        for g in 0..gpus {
            for k in [
                StreamKind::Compute,
                StreamKind::CpComm,
                StreamKind::PpComm,
                StreamKind::DpComm,
            ] {
                cx.b.add_stream(g, k);
            }
        }
        let (cpu, dpu) = (cp as usize, dp as usize);
        let wn = dpu * cpu;
        let mut route_buf: Vec<A2aRoute> = Vec::with_capacity(cpu);
        let stages = stage_layers(m.layers, pp)
            .into_iter()
            .enumerate()
            .map(|(p, (lf, ll))| {
                let p = p as u32;
                let nb = par.dp_buckets.min((ll - lf).max(1));
                let order = match par.pipeline {
                    PipelineKind::Ticks => Vec::new(),
                    k => stage_order(k, pp, p, ga),
                };
                let last_bwd_mb = match par.pipeline {
                    // Ticks run each stage's backwards in micro-batch order.
                    PipelineKind::Ticks => ga.checked_sub(1),
                    _ => order.iter().rev().find(|s| !s.0).map(|s| s.1),
                };
                let mut groups = vec![0; wn];
                let mut routes = Vec::with_capacity(wn);
                for r in 0..dp {
                    let grp = &mut groups[r as usize * cpu..(r as usize + 1) * cpu];
                    for (c, g) in grp.iter_mut().enumerate() {
                        *g = map.gpu(p, r, c as u32);
                    }
                    cx.a2a_pattern(grp, &mut route_buf);
                    routes.extend_from_slice(&route_buf);
                }
                StageState {
                    lf,
                    ll,
                    nb,
                    last_bwd_mb,
                    groups,
                    routes,
                    durs: vec![RankDur::default(); nanos * wn],
                    pair_in: vec![0; wn],
                    pair_out: vec![0; wn],
                    attn_f: vec![0; dpu],
                    attn_b: vec![0; dpu],
                    tokens: vec![0; dpu],
                    bucket_ready: vec![NONE; wn * nb as usize],
                }
            })
            .collect();
        let nslots = (pp * dp * cp * ga) as usize;
        Emitter {
            cx,
            cost,
            batch,
            split,
            nanos,
            wn,
            stages,
            last: vec![NONE; pp as usize * nanos * wn],
            f_first: vec![NONE; nslots],
            f_send: vec![NONE; nslots],
            b_first: vec![NONE; nslots],
            b_send: vec![NONE; nslots],
        }
    }

    fn idx(&self, p: u32, r: u32, c: u32, mb: u32) -> usize {
        let par = self.cx.map.par;
        (((p * par.dp + r) * par.cp + c) * par.ga + mb) as usize
    }

    /// Index into `last` of nano-batch k of rank i of stage p.
    fn li(&self, p: u32, k: usize, i: usize) -> usize {
        (p as usize * self.nanos + k) * self.wn + i
    }

    /// Durations and bytes of stage p's ranks for micro-batch mb.
    fn begin(&mut self, p: u32, mb: u32) {
        let par = self.cx.map.par;
        let (cp, cpu) = (par.cp, par.cp as usize);
        let last_stage = p + 1 == par.pp;
        let (cost, nanos, wn, split) = (self.cost, self.nanos, self.wn, self.split);
        let a = cost.attn();
        let st = &mut self.stages[p as usize];
        for r in 0..par.dp as usize {
            let seq = &self.batch[r][mb as usize];
            st.tokens[r] = seq.tokens();
            st.attn_f[r] = cost.attn_fwd_ps(seq.lengths(), split.q);
            st.attn_b[r] = cost.attn_bwd_ps(seq.lengths(), split.q);
            for c in 0..cpu {
                let t = chunk(st.tokens[r], cp, c as u32);
                for k in 0..nanos {
                    let t = chunk(t, nanos as u32, k as u32);
                    st.durs[k * wn + r * cpu + c] = RankDur {
                        pre_f: cost.linear_fwd_ps(LinearPart::PreAttn, t),
                        post_f: cost.linear_fwd_ps(LinearPart::PostAttn, t),
                        pre_b: cost.linear_bwd_ps(LinearPart::PreAttn, t),
                        post_b: cost.linear_bwd_ps(LinearPart::PostAttn, t),
                        head_f: if last_stage {
                            cost.lm_head_fwd_ps(t)
                        } else {
                            0
                        },
                        head_b: if last_stage {
                            2 * cost.lm_head_fwd_ps(t)
                        } else {
                            0
                        },
                    };
                }
                st.pair_in[r * cpu + c] = a.q_bytes(t, split.q) + a.kv_bytes(t, split.kv);
                st.pair_out[r * cpu + c] = a.q_bytes(t, split.q);
            }
        }
    }

    /// Replica r's forward linear block before layer l's attention (layer l's pre block
    /// and, after the first layer, layer l−1's post block), one op per nano-batch.
    fn fwd_linear(&mut self, p: u32, mb: u32, l: u32, r: usize) {
        self.cx.mb = mb;
        let cpu = self.cx.map.par.cp as usize;
        let lab = OpLabel {
            class: OpClass::LinearFwd,
            mb: mb as u16,
            layer: l as u16,
        };
        let lf = self.stages[p as usize].lf;
        for c in 0..cpu {
            let g = self.stages[p as usize].groups[r * cpu + c];
            for k in 0..self.nanos {
                let d = self.stages[p as usize].durs[k * self.wn + r * cpu + c];
                let li = self.li(p, k, r * cpu + c);
                let base = d.pre_f + if l > lf { d.post_f } else { 0 };
                let dur = self.cx.vary(g, l, OpClass::LinearFwd, base);
                let deps: &[OpId] = if self.last[li] == NONE {
                    &[]
                } else {
                    std::slice::from_ref(&self.last[li])
                };
                let op = self.cx.compute(g, dur, lab, deps);
                if l == lf && k == 0 {
                    let i = self.idx(p, r as u32, c as u32, mb);
                    self.f_first[i] = op;
                }
                self.last[li] = op;
            }
        }
    }

    /// Ulysses' own attention of layer l on replica r's CP group.
    fn builtin_attn(&mut self, p: u32, mb: u32, l: u32, r: usize, fwd: bool) {
        self.cx.mb = mb;
        let cpu = self.cx.map.par.cp as usize;
        let rs = r * cpu..(r + 1) * cpu;
        let lab = |class| OpLabel {
            class,
            mb: mb as u16,
            layer: l as u16,
        };
        // Built-in attention runs one nano-batch: stage p's `last` is its first W ranks.
        let base = self.li(p, 0, 0);
        let st = &self.stages[p as usize];
        let (attn, extra, bytes_in, bytes_out) = if fwd {
            (
                st.attn_f[r],
                0,
                &st.pair_in[rs.clone()],
                &st.pair_out[rs.clone()],
            )
        } else {
            let rec = self.cx.map.par.recompute;
            (
                st.attn_b[r],
                if rec { st.attn_f[r] } else { 0 },
                &st.pair_out[rs.clone()],
                &st.pair_in[rs.clone()],
            )
        };
        emit_attention(
            &mut self.cx,
            &st.groups[rs.clone()],
            &st.routes[rs.clone()],
            &mut self.last[base + rs.start..base + rs.end],
            l,
            lab,
            fwd,
            attn,
            extra,
            bytes_in,
            bytes_out,
        );
    }

    /// The end of a forward slot: the last layer's post block (and the LM head on the
    /// last stage), per nano-batch; then the activations' send to the next stage.
    fn fwd_end(&mut self, p: u32, mb: u32) {
        self.cx.mb = mb;
        let par = self.cx.map.par;
        let cpu = par.cp as usize;
        let last_stage = p + 1 == par.pp;
        let ll = self.stages[p as usize].ll;
        let lab = |class| OpLabel {
            class,
            mb: mb as u16,
            layer: (ll - 1) as u16,
        };
        for r in 0..par.dp as usize {
            for c in 0..cpu {
                let g = self.stages[p as usize].groups[r * cpu + c];
                let mut op = NONE;
                for k in 0..self.nanos {
                    let d = self.stages[p as usize].durs[k * self.wn + r * cpu + c];
                    let li = self.li(p, k, r * cpu + c);
                    let dur = self.cx.vary(g, ll, OpClass::LinearFwd, d.post_f);
                    op = self
                        .cx
                        .compute(g, dur, lab(OpClass::LinearFwd), &[self.last[li]]);
                    if last_stage {
                        let dur = self.cx.vary(g, ll - 1, OpClass::HeadFwd, d.head_f);
                        op = self.cx.compute(g, dur, lab(OpClass::HeadFwd), &[]);
                    }
                    self.last[li] = op;
                }
                if !last_stage {
                    let s = self.pp_send(p, p + 1, r, c, lab(OpClass::PpSendFwd), op);
                    let i = self.idx(p, r as u32, c as u32, mb);
                    self.f_send[i] = s;
                }
            }
        }
    }

    /// Rank (r, c) of stage p sends its tokens' hidden states (activations or their
    /// gradients) to the same rank of stage `to`, after `dep`.
    fn pp_send(&mut self, p: u32, to: u32, r: usize, c: usize, label: OpLabel, dep: OpId) -> OpId {
        let cp = self.cx.map.par.cp;
        let src = self.stages[p as usize].groups[r * cp as usize + c];
        let dst = self.cx.map.gpu(to, r as u32, c as u32);
        let tokens = self.stages[p as usize].tokens[r];
        let bytes = self.cost.hidden_bytes(chunk(tokens, cp, c as u32));
        let x = self.cx.b.add_xfer(Xfer { src, dst, bytes });
        let s = self.cx.stream(src, StreamKind::PpComm);
        self.cx.b.add_op(s, OpKind::Send(x), label, &[dep])
    }

    /// The start of a backward slot: the LM head's backward on the last stage and the last
    /// layer's post block, per nano-batch.
    fn bwd_begin(&mut self, p: u32, mb: u32) {
        self.cx.mb = mb;
        let par = self.cx.map.par;
        let (cpu, rec) = (par.cp as usize, par.recompute);
        let last_stage = p + 1 == par.pp;
        let ll = self.stages[p as usize].ll;
        let lab = |class| OpLabel {
            class,
            mb: mb as u16,
            layer: (ll - 1) as u16,
        };
        for r in 0..par.dp as usize {
            for c in 0..cpu {
                let g = self.stages[p as usize].groups[r * cpu + c];
                let mut first = NONE;
                for k in 0..self.nanos {
                    let d = self.stages[p as usize].durs[k * self.wn + r * cpu + c];
                    let li = self.li(p, k, r * cpu + c);
                    if last_stage {
                        let dur = self.cx.vary(
                            g,
                            ll - 1,
                            OpClass::HeadBwd,
                            d.head_b + if rec { d.head_f } else { 0 },
                        );
                        let op = self.cx.compute(g, dur, lab(OpClass::HeadBwd), &[]);
                        if first == NONE {
                            first = op;
                        }
                    }
                    // Variance layer index `ll`: the last layer's post block, drawn apart
                    // from the layer's own linear backward.
                    let dur = self.cx.vary(
                        g,
                        ll,
                        OpClass::LinearBwd,
                        d.post_b + if rec { d.post_f } else { 0 },
                    );
                    let op = self.cx.compute(g, dur, lab(OpClass::LinearBwd), &[]);
                    if first == NONE {
                        first = op;
                    }
                    self.last[li] = op;
                }
                let i = self.idx(p, r as u32, c as u32, mb);
                self.b_first[i] = first;
            }
        }
    }

    /// Replica r's backward linear block after layer l's attention (the `done`-th layer
    /// processed backward), one op per nano-batch; marks gradient buckets ready.
    fn bwd_linear(&mut self, p: u32, mb: u32, l: u32, r: usize, done: u32) {
        self.cx.mb = mb;
        let par = self.cx.map.par;
        let (cpu, rec) = (par.cp as usize, par.recompute);
        let (lf, ll, nb) = {
            let st = &self.stages[p as usize];
            (st.lf, st.ll, st.nb)
        };
        let n_layers = ll - lf;
        let last_mb_slot = self.stages[p as usize].last_bwd_mb == Some(mb);
        let lab = OpLabel {
            class: OpClass::LinearBwd,
            mb: mb as u16,
            layer: l as u16,
        };
        for c in 0..cpu {
            let g = self.stages[p as usize].groups[r * cpu + c];
            let mut op = NONE;
            for k in 0..self.nanos {
                let d = self.stages[p as usize].durs[k * self.wn + r * cpu + c];
                let li = self.li(p, k, r * cpu + c);
                let mut base = d.pre_b + if l > lf { d.post_b } else { 0 };
                if rec {
                    base += d.pre_f + if l > lf { d.post_f } else { 0 };
                }
                let dur = self.cx.vary(g, l, OpClass::LinearBwd, base);
                op = self.cx.compute(g, dur, lab, &[self.last[li]]);
                self.last[li] = op;
            }
            // The rank's last nano-batch ends its layer (one compute stream).
            if last_mb_slot {
                let i = (r * cpu + c) as u32;
                for bk in 0..nb {
                    if done == ((bk + 1) * n_layers).div_ceil(nb) {
                        self.stages[p as usize].bucket_ready[(i * nb + bk) as usize] = op;
                    }
                }
            }
        }
    }

    /// The end of a backward slot: the gradients' send to the previous stage, after the
    /// rank's last nano-batch.
    fn bwd_end(&mut self, p: u32, mb: u32) {
        if p == 0 {
            return;
        }
        self.cx.mb = mb;
        let par = self.cx.map.par;
        let cpu = par.cp as usize;
        let lab = OpLabel {
            class: OpClass::PpSendBwd,
            mb: mb as u16,
            layer: self.stages[p as usize].lf as u16,
        };
        for r in 0..par.dp as usize {
            for c in 0..cpu {
                // After the rank's last nano-batch (one compute stream).
                let li = self.li(p, self.nanos - 1, r * cpu + c);
                let s = self.pp_send(p, p - 1, r, c, lab, self.last[li]);
                let i = self.idx(p, r as u32, c as u32, mb);
                self.b_send[i] = s;
            }
        }
    }

    /// A plugged stage's attention of (stage p, layer l, mb), over stage p's ranks.
    fn stage_attn(
        &mut self,
        a: &mut dyn AttentionStage,
        env: &StepEnv<'_>,
        p: u32,
        l: u32,
        mb: u32,
        fwd: bool,
    ) -> Result<()> {
        let call = AttnCall {
            stage: p,
            layer: l,
            mb,
            fwd,
            recompute: self.cx.map.par.recompute,
        };
        let n = self.nanos * self.wn;
        let last = &mut self.last[p as usize * n..(p as usize + 1) * n];
        a.emit(&mut self.cx.b, env, call, last)
    }

    /// One slot of stage p: micro-batch mb forward or backward through all its layers.
    fn slot(
        &mut self,
        p: u32,
        fwd: bool,
        mb: u32,
        mut attn: Option<&mut dyn AttentionStage>,
        env: &StepEnv<'_>,
    ) -> Result<()> {
        self.begin(p, mb);
        let (lf, ll) = (self.stages[p as usize].lf, self.stages[p as usize].ll);
        let dpu = self.cx.map.par.dp as usize;
        if fwd {
            for l in lf..ll {
                for r in 0..dpu {
                    self.fwd_linear(p, mb, l, r);
                    if attn.is_none() {
                        self.builtin_attn(p, mb, l, r, true);
                    }
                }
                if let Some(a) = attn.as_deref_mut() {
                    self.stage_attn(a, env, p, l, mb, true)?;
                }
            }
            self.fwd_end(p, mb);
        } else {
            self.bwd_begin(p, mb);
            for (k, l) in (lf..ll).rev().enumerate() {
                if let Some(a) = attn.as_deref_mut() {
                    self.stage_attn(a, env, p, l, mb, false)?;
                }
                for r in 0..dpu {
                    if attn.is_none() {
                        self.builtin_attn(p, mb, l, r, false);
                    }
                    self.bwd_linear(p, mb, l, r, k as u32 + 1);
                }
            }
            self.bwd_end(p, mb);
        }
        Ok(())
    }

    /// One DistCA tick: every active stage runs its micro-batch in the tick's phase, layer
    /// j of every stage together; a pooled attention stage computes layer j's attention of
    /// all of them over every GPU (idle stages' GPUs included), called with
    /// `mb` = the tick index and `layer` = j.
    fn tick(
        &mut self,
        ti: u32,
        tick: &crate::balance::distca::pingpong::Tick,
        mut attn: Option<&mut dyn AttentionStage>,
        env: &StepEnv<'_>,
    ) -> Result<()> {
        use crate::balance::distca::pingpong::Phase;
        let fwd = tick.phase == Phase::Forward;
        let active: Vec<(u32, u32)> = tick
            .stages
            .iter()
            .enumerate()
            .filter_map(|(p, mb)| mb.map(|mb| (p as u32, mb)))
            .collect();
        let pooled = attn.as_deref().is_some_and(|a| a.pooled());
        let layers = self.stages[0].ll - self.stages[0].lf;
        let dpu = self.cx.map.par.dp as usize;
        for &(p, mb) in &active {
            self.begin(p, mb);
            if !fwd {
                self.bwd_begin(p, mb);
            }
        }
        for j in 0..layers {
            if !fwd && pooled {
                if let Some(a) = attn.as_deref_mut() {
                    self.pooled_attn(a, env, ti, j, false)?;
                }
            }
            for &(p, mb) in &active {
                let st = &self.stages[p as usize];
                let l = if fwd { st.lf + j } else { st.ll - 1 - j };
                if !fwd && !pooled {
                    if let Some(a) = attn.as_deref_mut() {
                        self.stage_attn(a, env, p, l, mb, false)?;
                    }
                }
                for r in 0..dpu {
                    if fwd {
                        self.fwd_linear(p, mb, l, r);
                    }
                    if attn.is_none() {
                        self.builtin_attn(p, mb, l, r, fwd);
                    }
                    if !fwd {
                        self.bwd_linear(p, mb, l, r, j + 1);
                    }
                }
                if fwd && !pooled {
                    if let Some(a) = attn.as_deref_mut() {
                        self.stage_attn(a, env, p, l, mb, true)?;
                    }
                }
            }
            if fwd && pooled {
                if let Some(a) = attn.as_deref_mut() {
                    self.pooled_attn(a, env, ti, j, true)?;
                }
            }
        }
        for &(p, mb) in &active {
            if fwd {
                self.fwd_end(p, mb);
            } else {
                self.bwd_end(p, mb);
            }
        }
        Ok(())
    }

    /// A pooled stage's attention of tick `ti`, layer j of every stage, over all GPUs.
    fn pooled_attn(
        &mut self,
        a: &mut dyn AttentionStage,
        env: &StepEnv<'_>,
        ti: u32,
        j: u32,
        fwd: bool,
    ) -> Result<()> {
        let call = AttnCall {
            stage: 0,
            layer: j,
            mb: ti,
            fwd,
            recompute: self.cx.map.par.recompute,
        };
        a.emit(&mut self.cx.b, env, call, &mut self.last)
    }

    /// Stage p's DP gradient all-reduce over its DP × CP ranks, bucket by bucket.
    fn dp_allreduce(&mut self, p: u32) {
        let map = self.cx.map;
        let (dp, cp, pp) = (map.par.dp, map.par.cp, map.par.pp);
        let dp_group: Vec<GpuId> = (0..dp)
            .flat_map(|r| (0..cp).map(move |c| (r, c)))
            .map(|(r, c)| map.gpu(p, r, c))
            .collect();
        if dp_group.len() <= 1 {
            return;
        }
        let (lf, ll, nb) = {
            let st = &self.stages[p as usize];
            (st.lf, st.ll, st.nb)
        };
        let bytes = stage_grad_bytes(&self.cost.model, ll - lf, p == 0, p + 1 == pp);
        for bk in 0..nb {
            let bb = chunk(bytes, nb, bk);
            let coll = self.cx.all_reduce(&dp_group, bb);
            for r in 0..dp {
                for c in 0..cp {
                    let g = map.gpu(p, r, c);
                    let ready =
                        self.stages[p as usize].bucket_ready[((r * cp + c) * nb + bk) as usize];
                    let deps: &[OpId] = if ready == NONE {
                        &[]
                    } else {
                        std::slice::from_ref(&ready)
                    };
                    let lab = OpLabel {
                        class: OpClass::DpAllReduce,
                        mb: u16::MAX,
                        layer: bk as u16,
                    };
                    self.cx.b.add_op(
                        self.cx.stream(g, StreamKind::DpComm),
                        OpKind::Coll(coll),
                        lab,
                        deps,
                    );
                }
            }
        }
    }

    /// Pipeline edges (a stage's forward waits for the previous stage's activations, its
    /// backward for the next stage's gradients), memory, and the graph.
    fn finish(mut self) -> Result<StepGraph> {
        let map = self.cx.map;
        let (dp, pp, cp, ga) = (map.par.dp, map.par.pp, map.par.cp, map.par.ga);
        for p in 0..pp {
            for r in 0..dp {
                for c in 0..cp {
                    for mb in 0..ga {
                        if p > 0 {
                            let (s, f) = (self.idx(p - 1, r, c, mb), self.idx(p, r, c, mb));
                            self.cx.b.add_dep(self.f_send[s], self.f_first[f]);
                        }
                        if p + 1 < pp {
                            let (s, f) = (self.idx(p + 1, r, c, mb), self.idx(p, r, c, mb));
                            self.cx.b.add_dep(self.b_send[s], self.b_first[f]);
                        }
                    }
                }
            }
        }
        let stages: Vec<(u32, u32)> = self.stages.iter().map(|s| (s.lf, s.ll)).collect();
        let (cost, batch, split) = (self.cost, self.batch, self.split);
        let mut tokens = 0u64;
        let mut pairs = 0u64;
        for mbs in batch {
            for s in mbs {
                tokens += s.tokens();
                pairs += s.causal_pairs();
            }
        }
        let memory = (0..map.gpus())
            .map(|g| rank_memory_of(cost, &map, &stages, split, batch, map.coords(g)))
            .collect();
        Ok(StepGraph {
            graph: self.cx.b.build()?,
            map,
            tokens,
            causal_pairs: pairs,
            memory,
            streams_per_gpu: 4,
        })
    }
}

/// One layer's attention block on every rank of the CP group: all-to-all in, core
/// attention, all-to-all out (or, in backward, dO in, attention backward, dQ/dK/dV out).
#[allow(clippy::too_many_arguments)]
fn emit_attention(
    cx: &mut Ctx<'_>,
    group: &[GpuId],
    routes: &[A2aRoute],
    last: &mut [OpId],
    layer: u32,
    lab: impl Fn(OpClass) -> OpLabel,
    fwd: bool,
    attn: Ps,
    extra: Ps,
    bytes_in: &[u64],
    bytes_out: &[u64],
) {
    let cp = group.len();
    let (c_in, c_out, c_attn) = if fwd {
        (OpClass::A2aIn, OpClass::A2aOut, OpClass::AttnFwd)
    } else {
        (OpClass::A2aOut, OpClass::A2aIn, OpClass::AttnBwd)
    };
    if cp > 1 {
        let coll = cx.all_to_all(routes, bytes_in);
        for c in 0..cp {
            last[c] = cx.b.add_op(
                cx.stream(group[c], StreamKind::CpComm),
                OpKind::Coll(coll),
                lab(c_in),
                &[last[c]],
            );
        }
    }
    for c in 0..cp {
        let dur = cx.vary(group[c], layer, c_attn, attn + extra);
        let deps: &[OpId] = if cp > 1 {
            std::slice::from_ref(&last[c])
        } else {
            &[]
        };
        last[c] = cx.compute(group[c], dur, lab(c_attn), deps);
    }
    if cp > 1 {
        let coll = cx.all_to_all(routes, bytes_out);
        for c in 0..cp {
            last[c] = cx.b.add_op(
                cx.stream(group[c], StreamKind::CpComm),
                OpKind::Coll(coll),
                lab(c_out),
                &[last[c]],
            );
        }
    }
}

fn rank_memory_of(
    cost: &CostModel,
    map: &RankMap,
    stages: &[(u32, u32)],
    split: HeadSplit,
    batch: &[Vec<PackedSeq>],
    at: Coords,
) -> MemoryBreakdown {
    let par = map.par;
    let (lf, ll) = stages[at.pp as usize];
    let cap = batch[at.dp as usize]
        .iter()
        .map(|s| u64::from(s.capacity))
        .max()
        .unwrap_or(0);
    let n_layers = ll - lf;
    let grad_bytes = stage_grad_bytes(&cost.model, n_layers, at.pp == 0, at.pp + 1 == par.pp);
    rank_memory(
        &cost.model,
        &MemoryInputs {
            layers: n_layers,
            first_stage: at.pp == 0,
            last_stage: at.pp + 1 == par.pp,
            zero_stage: par.zero_stage,
            shard_degree: par.dp * par.cp,
            tokens_per_rank: cap.div_ceil(u64::from(par.cp)),
            attn_tokens: cap,
            attn_heads_q: split.q,
            attn_heads_kv: split.kv,
            in_flight: in_flight(par.pipeline, par.pp, at.pp, par.ga),
            recompute: par.recompute,
            bucket_bytes: if par.dp * par.cp > 1 {
                grad_bytes.div_ceil(u64::from(par.dp_buckets))
            } else {
                0
            },
        },
    )
}

#[cfg(test)]
mod tests;
