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
//! started together when the last rank arrives. On a node-aligned group (whole blocks of
//! consecutive ranks per node, as the placement makes them):
//! - all-to-all: each rank sends one aggregate over NVLink (the bytes for all same-node
//!   peers, to the next rank of its node) and one over its NIC (the bytes for all remote
//!   peers, to the rank at its position in the next node) — the per-GPU egress that
//!   bounds an all-to-all on a non-blocking fabric, with destinations that are
//!   permutations so no port receives two aggregates;
//! - ring all-reduce of B bytes over n ranks (2(n−1)/n · B per rank), as NCCL runs it with
//!   one channel per GPU of a node: 1/g of a rank's ring traffic crosses to the next node
//!   through its own NIC, the rest goes over NVLink to the next rank of its node.
//!
//! Other groups fall back to the first same-node and first remote peer (all-to-all) and
//! to a single ring over the group's order (all-reduce).
//!
//! Recomputation adds each layer's forward compute to its backward compute (the
//! all-to-alls are not repeated). Embedding lookup and the optimizer step are not priced.

use super::{Coords, PipelineKind, Placement, RankMap, RuntimeVariance};
use crate::cost::memory::{rank_memory, stage_grad_bytes, MemoryBreakdown, MemoryInputs};
use crate::cost::{CostModel, LinearPart};
use crate::engine::{
    CollId, Graph, GraphBuilder, OpClass, OpId, OpKind, OpLabel, StreamId, StreamKind, Xfer,
};
use crate::error::{invalid, Result};
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
    }
    v
}

/// Micro-batches whose activations a stage holds at its peak.
pub fn in_flight(kind: PipelineKind, pp: u32, stage: u32, ga: u32) -> u32 {
    match kind {
        PipelineKind::Gpipe => ga,
        PipelineKind::OneFOneB => (pp - stage).min(ga),
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
        if let Some(sh) = GroupShape::of(gpus, place) {
            for (i, &src) in gpus.iter().enumerate() {
                let (k, j) = (i / sh.per_node, i % sh.per_node);
                let intra = gpus[k * sh.per_node + (j + 1) % sh.per_node];
                let inter = gpus[((k + 1) % sh.nodes) * sh.per_node + j];
                out.push(A2aRoute {
                    src,
                    d_in: intra,
                    n_in: (sh.per_node - 1) as u64,
                    d_out: inter,
                    n_out: (n - sh.per_node) as u64,
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

    /// A ring all-reduce of `bytes` over `gpus`.
    fn all_reduce(&mut self, gpus: &[GpuId], bytes: u64) -> CollId {
        self.xf.clear();
        let n = gpus.len();
        if n > 1 {
            let per = (2 * (n as u64 - 1) * bytes).div_ceil(n as u64);
            match GroupShape::of(gpus, self.map.place) {
                // NCCL's ring with one channel per GPU of a node: each channel crosses the
                // node boundary through a different NIC, so a GPU moves 1/g of its ring
                // traffic over its NIC (to the same position in the next node) and the
                // rest over NVLink (to the next GPU of its node).
                Some(sh) if sh.nodes > 1 => {
                    let g = sh.per_node as u64;
                    let inter = per.div_ceil(g);
                    let intra = per - inter;
                    for (i, &src) in gpus.iter().enumerate() {
                        let (k, j) = (i / sh.per_node, i % sh.per_node);
                        if sh.per_node > 1 {
                            let dst = gpus[k * sh.per_node + (j + 1) % sh.per_node];
                            self.xf.push(Xfer {
                                src,
                                dst,
                                bytes: intra,
                            });
                        }
                        let dst = gpus[((k + 1) % sh.nodes) * sh.per_node + j];
                        self.xf.push(Xfer {
                            src,
                            dst,
                            bytes: inter,
                        });
                    }
                }
                _ => {
                    for (i, &src) in gpus.iter().enumerate() {
                        self.xf.push(Xfer {
                            src,
                            dst: gpus[(i + 1) % n],
                            bytes: per,
                        });
                    }
                }
            }
        }
        let xf = std::mem::take(&mut self.xf);
        let c = self.b.add_collective(&xf);
        self.xf = xf;
        c
    }
}

/// A group laid out as `nodes` whole blocks of `per_node` consecutive members, each block
/// on one node (CP and DP groups under the placement rule, whenever they fill nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GroupShape {
    nodes: usize,
    per_node: usize,
}

impl GroupShape {
    fn of(gpus: &[GpuId], place: Placement) -> Option<GroupShape> {
        let first = *gpus.first()?;
        let per_node = gpus
            .iter()
            .take_while(|&&g| place.node(g) == place.node(first))
            .count();
        if per_node == 0 || gpus.len() % per_node != 0 {
            return None;
        }
        let nodes = gpus.len() / per_node;
        let mut prev: Option<u32> = None;
        for block in gpus.chunks(per_node) {
            let node = place.node(block[0]);
            // Blocks on distinct nodes, in increasing node order (as the placement lays
            // groups out); anything else takes the general lowering.
            if block.iter().any(|&g| place.node(g) != node) || prev.is_some_and(|p| node <= p) {
                return None;
            }
            prev = Some(node);
        }
        Some(GroupShape { nodes, per_node })
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
    mut attn: Option<&mut dyn crate::schedule::stage::AttentionStage>,
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
    let env = crate::schedule::stage::StepEnv { map, var, step };
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
    let (dp, pp, cp, ga) = (par.dp, par.pp, par.cp, par.ga);
    let stages = stage_layers(m.layers, pp);
    let gpus = map.gpus();
    let a = cost.attn();
    let ops_est = gpus as usize * ga as usize * (m.layers as usize / pp as usize + 1) * 8 + 16;
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
    // Per (stage, replica, cp, mb): the first op of each slot and its send, for PP edges.
    let idx = |p: u32, r: u32, c: u32, mb: u32| (((p * dp + r) * cp + c) * ga + mb) as usize;
    let nslots = (pp * dp * cp * ga) as usize;
    let (mut f_first, mut f_send, mut b_first, mut b_send) = (
        vec![NONE; nslots],
        vec![NONE; nslots],
        vec![NONE; nslots],
        vec![NONE; nslots],
    );
    let buckets = par.dp_buckets;
    let mut bucket_ready: Vec<OpId> = Vec::new();
    let mut tokens_total = 0u64;
    let mut pairs_total = 0u64;
    for mbs in batch {
        for s in mbs {
            tokens_total += s.tokens();
            pairs_total += s.causal_pairs();
        }
    }

    // Ops are emitted slot by slot and layer by layer with the replicas innermost, so ops
    // that run at about the same simulated time sit next to each other in memory (the
    // engine's working set stays small even with thousands of replicas).
    let (cpu, dpu) = (cp as usize, dp as usize);
    let mut groups: Vec<GpuId> = vec![0; dpu * cpu];
    let mut routes: Vec<A2aRoute> = Vec::with_capacity(dpu * cpu);
    let mut route_buf: Vec<A2aRoute> = Vec::with_capacity(cpu);
    // Per (nano-batch k, rank i) at k·W + i: the rank's last op and its linear durations.
    let wn = dpu * cpu;
    let mut last: Vec<OpId> = vec![NONE; nanos * wn];
    let mut durs: Vec<RankDur> = vec![RankDur::default(); nanos * wn];
    let mut pair_in: Vec<u64> = vec![0; dpu * cpu];
    let mut pair_out: Vec<u64> = vec![0; dpu * cpu];
    let mut attn_f: Vec<Ps> = vec![0; dpu];
    let mut attn_b: Vec<Ps> = vec![0; dpu];
    let mut tokens: Vec<u64> = vec![0; dpu];
    let rec = par.recompute;

    for p in 0..pp {
        let (lf, ll) = stages[p as usize];
        let last_stage = p + 1 == pp;
        let n_layers = ll - lf;
        let nb = buckets.min(n_layers.max(1));
        // Backward processes layers ll-1 down to lf; bucket k is ready after the
        // ceil((k+1)·n/nb)-th processed layer.
        bucket_ready.clear();
        bucket_ready.resize((dp * cp * nb) as usize, NONE);
        let order = stage_order(par.pipeline, pp, p, ga);
        let last_bwd_mb = order.iter().rev().find(|s| !s.0).map(|s| s.1);
        routes.clear();
        for r in 0..dp {
            let grp = &mut groups[r as usize * cpu..(r as usize + 1) * cpu];
            for (c, g) in grp.iter_mut().enumerate() {
                *g = map.gpu(p, r, c as u32);
            }
            cx.a2a_pattern(grp, &mut route_buf);
            routes.extend_from_slice(&route_buf);
        }
        last.iter_mut().for_each(|x| *x = NONE);
        for &(fwd, mb) in &order {
            for r in 0..dpu {
                let seq = &batch[r][mb as usize];
                tokens[r] = seq.tokens();
                attn_f[r] = cost.attn_fwd_ps(seq.lengths(), split.q);
                attn_b[r] = cost.attn_bwd_ps(seq.lengths(), split.q);
                for c in 0..cpu {
                    let t = chunk(tokens[r], cp, c as u32);
                    for k in 0..nanos {
                        let t = chunk(t, nanos as u32, k as u32);
                        durs[k * wn + r * cpu + c] = RankDur {
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
                    pair_in[r * cpu + c] = a.q_bytes(t, split.q) + a.kv_bytes(t, split.kv);
                    pair_out[r * cpu + c] = a.q_bytes(t, split.q);
                }
            }
            let mb16 = mb as u16;
            cx.mb = mb;
            if fwd {
                for l in lf..ll {
                    let lab = |class| OpLabel {
                        class,
                        mb: mb16,
                        layer: l as u16,
                    };
                    for r in 0..dpu {
                        let rs = r * cpu..(r + 1) * cpu;
                        for c in 0..cpu {
                            let g = groups[r * cpu + c];
                            for k in 0..nanos {
                                let i = k * wn + r * cpu + c;
                                let d = durs[i];
                                let base = d.pre_f + if l > lf { d.post_f } else { 0 };
                                let dur = cx.vary(g, l, OpClass::LinearFwd, base);
                                let deps: &[OpId] = if last[i] == NONE {
                                    &[]
                                } else {
                                    std::slice::from_ref(&last[i])
                                };
                                let op = cx.b.add_op(
                                    cx.stream(g, StreamKind::Compute),
                                    OpKind::Compute(dur),
                                    lab(OpClass::LinearFwd),
                                    deps,
                                );
                                if l == lf && k == 0 {
                                    f_first[idx(p, r as u32, c as u32, mb)] = op;
                                }
                                last[i] = op;
                            }
                        }
                        if attn.is_none() {
                            emit_attention(
                                &mut cx,
                                &groups[rs.clone()],
                                &routes[rs.clone()],
                                &mut last[rs.clone()],
                                l,
                                lab,
                                true,
                                attn_f[r],
                                0,
                                &pair_in[rs.clone()],
                                &pair_out[rs],
                            );
                        }
                    }
                    if let Some(a) = attn.as_deref_mut() {
                        let call = crate::schedule::stage::AttnCall {
                            stage: p,
                            layer: l,
                            mb,
                            fwd: true,
                            recompute: rec,
                        };
                        a.emit(&mut cx.b, &env, call, &mut last)?;
                    }
                }
                let lab = |class| OpLabel {
                    class,
                    mb: mb16,
                    layer: (ll - 1) as u16,
                };
                for r in 0..dpu {
                    for c in 0..cpu {
                        let g = groups[r * cpu + c];
                        let mut op = NONE;
                        for k in 0..nanos {
                            let i = k * wn + r * cpu + c;
                            let d = durs[i];
                            let dur = cx.vary(g, ll, OpClass::LinearFwd, d.post_f);
                            op = cx.b.add_op(
                                cx.stream(g, StreamKind::Compute),
                                OpKind::Compute(dur),
                                lab(OpClass::LinearFwd),
                                &[last[i]],
                            );
                            if last_stage {
                                let dur = cx.vary(g, ll - 1, OpClass::HeadFwd, d.head_f);
                                op = cx.b.add_op(
                                    cx.stream(g, StreamKind::Compute),
                                    OpKind::Compute(dur),
                                    lab(OpClass::HeadFwd),
                                    &[],
                                );
                            }
                            last[i] = op;
                        }
                        if !last_stage {
                            let dst = map.gpu(p + 1, r as u32, c as u32);
                            let bytes = cost.hidden_bytes(chunk(tokens[r], cp, c as u32));
                            let x = cx.b.add_xfer(Xfer { src: g, dst, bytes });
                            let s = cx.b.add_op(
                                cx.stream(g, StreamKind::PpComm),
                                OpKind::Send(x),
                                lab(OpClass::PpSendFwd),
                                &[op],
                            );
                            f_send[idx(p, r as u32, c as u32, mb)] = s;
                        }
                    }
                }
            } else {
                let lab = |class| OpLabel {
                    class,
                    mb: mb16,
                    layer: (ll - 1) as u16,
                };
                for r in 0..dpu {
                    for c in 0..cpu {
                        let g = groups[r * cpu + c];
                        let mut first = NONE;
                        for k in 0..nanos {
                            let i = k * wn + r * cpu + c;
                            let d = durs[i];
                            if last_stage {
                                let dur = cx.vary(
                                    g,
                                    ll - 1,
                                    OpClass::HeadBwd,
                                    d.head_b + if rec { d.head_f } else { 0 },
                                );
                                let op = cx.b.add_op(
                                    cx.stream(g, StreamKind::Compute),
                                    OpKind::Compute(dur),
                                    lab(OpClass::HeadBwd),
                                    &[],
                                );
                                if first == NONE {
                                    first = op;
                                }
                            }
                            // Variance layer index `ll`: the last layer's post block, drawn
                            // apart from the layer's own linear backward below.
                            let dur = cx.vary(
                                g,
                                ll,
                                OpClass::LinearBwd,
                                d.post_b + if rec { d.post_f } else { 0 },
                            );
                            let op = cx.b.add_op(
                                cx.stream(g, StreamKind::Compute),
                                OpKind::Compute(dur),
                                lab(OpClass::LinearBwd),
                                &[],
                            );
                            if first == NONE {
                                first = op;
                            }
                            last[i] = op;
                        }
                        b_first[idx(p, r as u32, c as u32, mb)] = first;
                    }
                }
                let last_mb_slot = last_bwd_mb == Some(mb);
                for (k, l) in (lf..ll).rev().enumerate() {
                    let lab = |class| OpLabel {
                        class,
                        mb: mb16,
                        layer: l as u16,
                    };
                    if let Some(a) = attn.as_deref_mut() {
                        let call = crate::schedule::stage::AttnCall {
                            stage: p,
                            layer: l,
                            mb,
                            fwd: false,
                            recompute: rec,
                        };
                        a.emit(&mut cx.b, &env, call, &mut last)?;
                    }
                    for r in 0..dpu {
                        let rs = r * cpu..(r + 1) * cpu;
                        if attn.is_none() {
                            emit_attention(
                                &mut cx,
                                &groups[rs.clone()],
                                &routes[rs.clone()],
                                &mut last[rs.clone()],
                                l,
                                lab,
                                false,
                                attn_b[r],
                                if rec { attn_f[r] } else { 0 },
                                &pair_out[rs.clone()],
                                &pair_in[rs],
                            );
                        }
                        for c in 0..cpu {
                            let g = groups[r * cpu + c];
                            let mut op = NONE;
                            for nk in 0..nanos {
                                let i = nk * wn + r * cpu + c;
                                let d = durs[i];
                                let mut base = d.pre_b + if l > lf { d.post_b } else { 0 };
                                if rec {
                                    base += d.pre_f + if l > lf { d.post_f } else { 0 };
                                }
                                let dur = cx.vary(g, l, OpClass::LinearBwd, base);
                                op = cx.b.add_op(
                                    cx.stream(g, StreamKind::Compute),
                                    OpKind::Compute(dur),
                                    lab(OpClass::LinearBwd),
                                    &[last[i]],
                                );
                                last[i] = op;
                            }
                            // The rank's last nano-batch ends its layer (one compute stream).
                            if last_mb_slot {
                                let i = (r * cpu + c) as u32;
                                let done = k as u32 + 1;
                                for bk in 0..nb {
                                    if done == ((bk + 1) * n_layers).div_ceil(nb) {
                                        bucket_ready[(i * nb + bk) as usize] = op;
                                    }
                                }
                            }
                        }
                    }
                }
                if p > 0 {
                    let lab = OpLabel {
                        class: OpClass::PpSendBwd,
                        mb: mb16,
                        layer: lf as u16,
                    };
                    for r in 0..dpu {
                        for c in 0..cpu {
                            let g = groups[r * cpu + c];
                            // After the rank's last nano-batch (one compute stream).
                            let i = (nanos - 1) * wn + r * cpu + c;
                            let dst = map.gpu(p - 1, r as u32, c as u32);
                            let bytes = cost.hidden_bytes(chunk(tokens[r], cp, c as u32));
                            let x = cx.b.add_xfer(Xfer { src: g, dst, bytes });
                            let s = cx.b.add_op(
                                cx.stream(g, StreamKind::PpComm),
                                OpKind::Send(x),
                                lab,
                                &[last[i]],
                            );
                            b_send[idx(p, r as u32, c as u32, mb)] = s;
                        }
                    }
                }
            }
        }
        // DP gradient all-reduce over the stage's DP × CP ranks, bucket by bucket.
        let dp_group: Vec<GpuId> = (0..dp)
            .flat_map(|r| (0..cp).map(move |c| (r, c)))
            .map(|(r, c)| map.gpu(p, r, c))
            .collect();
        if dp_group.len() > 1 {
            let bytes = stage_grad_bytes(m, n_layers, p == 0, last_stage);
            for bk in 0..nb {
                let bb = chunk(bytes, nb, bk);
                let coll = cx.all_reduce(&dp_group, bb);
                for r in 0..dp {
                    for c in 0..cp {
                        let g = map.gpu(p, r, c);
                        let ready = bucket_ready[((r * cp + c) * nb + bk) as usize];
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
                        cx.b.add_op(
                            cx.stream(g, StreamKind::DpComm),
                            OpKind::Coll(coll),
                            lab,
                            deps,
                        );
                    }
                }
            }
        }
    }
    // Pipeline edges: a stage's forward waits for the previous stage's activations, its
    // backward for the next stage's gradients.
    for p in 0..pp {
        for r in 0..dp {
            for c in 0..cp {
                for mb in 0..ga {
                    if p > 0 {
                        cx.b.add_dep(f_send[idx(p - 1, r, c, mb)], f_first[idx(p, r, c, mb)]);
                    }
                    if p + 1 < pp {
                        cx.b.add_dep(b_send[idx(p + 1, r, c, mb)], b_first[idx(p, r, c, mb)]);
                    }
                }
            }
        }
    }
    let memory = (0..gpus)
        .map(|g| rank_memory_of(cost, &map, &stages, split, batch, map.coords(g)))
        .collect();
    Ok(StepGraph {
        graph: cx.b.build()?,
        map,
        tokens: tokens_total,
        causal_pairs: pairs_total,
        memory,
        streams_per_gpu: 4,
    })
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
        last[c] = cx.b.add_op(
            cx.stream(group[c], StreamKind::Compute),
            OpKind::Compute(dur),
            lab(c_attn),
            deps,
        );
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
