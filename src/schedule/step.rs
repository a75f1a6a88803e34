//! The step builder: one training step of DP × PP × CP (× TP, EP) with GA micro-batches,
//! lowered to an engine op graph. It emits every linear block (as TP/EP pieces and their
//! collectives), the pipeline sends, gradient accumulation and the DP gradient all-reduce,
//! and hands each layer's core attention to an [`AttentionStage`]: Ulysses' all-to-alls
//! ([`super::ulysses::UlyssesAttention`], what [`build_step`] runs) or any other stage
//! ([`build_step_with`]). Replica r's CP ranks split its packed sequence into CP
//! contiguous chunks for the linear work.
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
//! With Ulysses' attention the replicas, which couple only at the gradient all-reduce,
//! are emitted in parts on every core and laid out as one emitter would lay them out, so
//! the graph does not depend on the thread count.
//!
//! Recomputation adds each layer's forward compute to its backward compute. Embedding lookup and the optimizer step are not priced.

use super::pipeline;
use super::stage::{AttentionStage, AttnCall, StepEnv};
use super::ulysses::UlyssesAttention;
use super::{Coords, Parallelism, PipelineKind, Placement, RankMap, RuntimeVariance};
use crate::cost::memory::{
    rank_memory, stage_expert_params, stage_params, stage_rank_params, MemoryBreakdown,
    MemoryInputs,
};
use crate::cost::{CostModel, LinearPart, LinearPiece, ModelConfig};
use crate::engine::parts::{assemble, Mark, Part};
use crate::engine::{
    CollId, Graph, GraphBuilder, OpClass, OpId, OpKind, OpLabel, StreamId, StreamKind, Xfer,
};
use crate::error::{invalid, Result};
use crate::net::collective::{node_blocks, CollOp};
use crate::net::{GpuId, Ps};
use crate::workload::PackedSeq;
use rayon::prelude::*;

pub use super::pipeline::{in_flight, stage_layers, stage_order};
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
    /// The step's exact query–key pairs under each of the model's mask classes
    /// (`CostModel::class_pairs`; one entry, the causal pairs, for a causal model).
    pub class_pairs: Vec<u64>,
    /// Per-rank peak memory, by GPU.
    pub memory: Vec<MemoryBreakdown>,
    /// Stream ids of each GPU: `[compute, cp, pp, dp]` at `4·gpu + k`.
    pub streams_per_gpu: u32,
}

/// Tokens of chunk `c` when `tokens` are cut into `n` contiguous chunks (sizes differ by
/// at most one).
pub(super) fn chunk(tokens: u64, n: u32, c: u32) -> u64 {
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
    /// Under TP or EP, the forward pieces between collectives ([`Link::Gemm`]).
    qkv_f: Ps,
    oproj_f: Ps,
    ffn_f: Ps,
    experts_f: Ps,
    /// Under TP and EP, the shared experts (between their all-gather and reduce-scatter).
    shared_f: Ps,
    /// The activation of the rank's tokens (what a TP all-gather gathers).
    tp_bytes: u64,
    /// Bytes an EP dispatch sends to each peer of the EP group.
    ep_pair_bytes: u64,
}

/// One link of a layer's linear chain under tensor or expert parallelism (forward order;
/// the backward runs the chain reversed, an all-gather's gradient being a reduce-scatter
/// and the reverse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// A compute piece.
    Gemm(Piece),
    /// TP all-gather of the activation (sequence parallelism).
    Ag,
    /// TP reduce-scatter of the activation (sequence parallelism).
    Rs,
    /// TP all-reduce of the activation (no sequence parallelism).
    Ar,
    /// EP all-to-all: the dispatch of routed token copies, or their combine.
    Ep,
}

/// The compute pieces of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    Qkv,
    OutProj,
    Ffn,
    Experts,
    Shared,
    Head,
}

struct Ctx<'a> {
    map: RankMap,
    var: &'a dyn RuntimeVariance,
    step: u64,
    /// The micro-batch whose ops are being emitted (for the variance draw).
    mb: u32,
    b: GraphBuilder,
    xf: Vec<Xfer>,
    /// For a part of some replicas: (GPUs per stage, the part's first offset in a stage,
    /// its GPUs per stage); its streams are its own, GPU by GPU in stage order.
    local: Option<(u32, u32, u32)>,
}

impl Ctx<'_> {
    fn stream(&self, gpu: GpuId, k: StreamKind) -> StreamId {
        part_stream(&self.map, self.local, gpu, k)
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

    /// An all-to-all over a group (its `routes`) where rank i sends `pair_bytes[i]` to
    /// every peer.
    fn all_to_all(&mut self, routes: &[A2aRoute], pair_bytes: &[u64]) -> CollId {
        all_to_all(&mut self.b, &mut self.xf, routes, pair_bytes)
    }

    /// The all-reduce of `bytes` over `gpus`, lowered by the cluster's collective model.
    fn all_reduce(&mut self, gpus: &[GpuId], bytes: u64) -> CollId {
        self.collective(CollOp::AllReduce, gpus, bytes)
    }

    /// `op` of `bytes` (nccl-tests' size) over `gpus`, lowered by the cluster's collective
    /// model (NCCL's algorithm choice and latency).
    fn collective(&mut self, op: CollOp, gpus: &[GpuId], bytes: u64) -> CollId {
        let place = self.map.place;
        let lw = place.coll.lower(op, gpus, bytes, place.gpus_per_node);
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

pub(super) const NONE: OpId = OpId::MAX;

/// How one rank's all-to-all traffic is aggregated.
#[derive(Clone, Copy, Debug)]
pub(super) struct A2aRoute {
    src: GpuId,
    d_in: GpuId,
    n_in: u64,
    d_out: GpuId,
    n_out: u64,
}

/// The stream of `kind` on `gpu` in a builder of the whole step (`local` = `None`) or of a
/// part of some replicas (`local` = (GPUs per stage, the part's first offset in a stage,
/// its GPUs per stage); its streams are its own, GPU by GPU in stage order).
pub(super) fn part_stream(
    map: &RankMap,
    local: Option<(u32, u32, u32)>,
    gpu: GpuId,
    kind: StreamKind,
) -> StreamId {
    let g = match local {
        None => gpu,
        Some((w, first, n)) => gpu / w * n + (gpu % w - first),
    };
    map.streams_per_gpu() * g + kind as u32
}

/// The all-to-all pattern of a group: for each rank, (same-node peer, how many
/// same-node peers, remote peer, how many remote peers). On a node-aligned group the
/// peers are permutations (next rank in the node; same position in the next node), so
/// no NIC or NVLink port receives more than one aggregate.
pub(super) fn a2a_pattern(place: &Placement, gpus: &[GpuId], out: &mut Vec<A2aRoute>) {
    out.clear();
    let n = gpus.len();
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
pub(super) fn all_to_all(
    b: &mut GraphBuilder,
    xf: &mut Vec<Xfer>,
    routes: &[A2aRoute],
    pair_bytes: &[u64],
) -> CollId {
    xf.clear();
    for (r, &pb) in routes.iter().zip(pair_bytes) {
        if r.n_in > 0 {
            xf.push(Xfer {
                src: r.src,
                dst: r.d_in,
                bytes: r.n_in * pb,
            });
        }
        if r.n_out > 0 {
            xf.push(Xfer {
                src: r.src,
                dst: r.d_out,
                bytes: r.n_out * pb,
            });
        }
    }
    b.add_collective(xf)
}

/// Build one training step with Ulysses' attention ([`UlyssesAttention`]): `batch[r][m]`
/// is replica r's micro-batch m (one packed sequence per CP group per micro-batch). The
/// replicas are emitted in parallel parts; the graph is the same at any thread count.
pub fn build_step(
    cost: &CostModel,
    map: RankMap,
    batch: &[Vec<PackedSeq>],
    step: u64,
    var: &dyn RuntimeVariance,
) -> Result<StepGraph> {
    let env = StepEnv { map, var, step };
    build_parts(cost, env, batch, 4 * rayon::current_num_threads())
}

/// One training step with the core attention of every layer handed to `attn` (an
/// [`AttentionStage`]: e.g. a lowered Plan, or [`UlyssesAttention`] emitted by one
/// emitter); linear blocks, pipeline sends, GA and the DP all-reduce are [`build_step`]'s.
/// `batch[r][m]` still gives replica r's tokens (the linear work of its CP ranks).
pub fn build_step_with(
    cost: &CostModel,
    map: RankMap,
    batch: &[Vec<PackedSeq>],
    step: u64,
    var: &dyn RuntimeVariance,
    attn: &mut dyn AttentionStage,
) -> Result<StepGraph> {
    let env = StepEnv { map, var, step };
    build(cost, env, batch, true, |cost, _| {
        emit_whole(cost, &env, batch, attn)
    })
}

/// [`build_step`] with the replicas emitted in up to `parts` parts in parallel (the graph
/// does not depend on how many).
fn build_parts(
    cost: &CostModel,
    env: StepEnv<'_>,
    batch: &[Vec<PackedSeq>],
    parts: usize,
) -> Result<StepGraph> {
    build(cost, env, batch, false, |cost, split| {
        if env.map.par.dp == 0 {
            let mut u = UlyssesAttention::part(cost, env.map, batch, split, 0, 0, None);
            emit_whole(cost, &env, batch, &mut u)
        } else {
            emit_parts(cost, &env, batch, split, parts)
        }
    })
}

/// The step's checks, memory and totals around `emit`, which makes its graph from one TP
/// rank's cost model and the heads a rank's attention holds (Ulysses' whole-head split,
/// or with a `plugged` stage the rounded-up share: [`attn_split`]).
fn build(
    cost: &CostModel,
    env: StepEnv<'_>,
    batch: &[Vec<PackedSeq>],
    plugged: bool,
    emit: impl FnOnce(&CostModel, HeadSplit) -> Result<Graph>,
) -> Result<StepGraph> {
    let (shard, split) = checked(cost, env.map.par, batch, plugged)?;
    let graph = emit(&shard, split)?;
    Ok(step_facts(&shard, env.map, batch, split, graph))
}

/// The step's checks: one TP rank's share of the model (which prices every piece of work)
/// and the heads a rank's attention holds.
fn checked(
    cost: &CostModel,
    par: Parallelism,
    batch: &[Vec<PackedSeq>],
    plugged: bool,
) -> Result<(CostModel, HeadSplit)> {
    check_moe_layout(&cost.model, par)?;
    let shard = cost.tp_shard(par.tp, par.ep)?;
    let m = &shard.model;
    let split = attn_split(m, par.cp, plugged)?;
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
    pipeline::check(&par, m.layers, "[parallel]")?;
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
    Ok((shard, split))
}

/// The step with `graph`: its layout, tokens, query–key pairs and per-rank memory (`cost`:
/// one TP rank's).
fn step_facts(
    cost: &CostModel,
    map: RankMap,
    batch: &[Vec<PackedSeq>],
    split: HeadSplit,
    graph: Graph,
) -> StepGraph {
    let chunks = pipeline::chunk_layers(&map.par, cost.model.layers);
    let tokens = batch.iter().flatten().map(PackedSeq::tokens).sum();
    let class_pairs = cost.class_pairs(
        &batch
            .iter()
            .flatten()
            .flat_map(|s| s.lengths())
            .collect::<Vec<u32>>(),
    );
    let memory = (0..map.gpus())
        .into_par_iter()
        .map(|g| rank_memory_of(cost, &map, &chunks, split, batch, map.coords(g)))
        .collect();
    StepGraph {
        graph,
        map,
        tokens,
        class_pairs,
        memory,
        streams_per_gpu: map.streams_per_gpu(),
    }
}

/// The step's graph from one emitter over every replica, `attn` emitting each layer's
/// attention.
fn emit_whole(
    cost: &CostModel,
    env: &StepEnv<'_>,
    batch: &[Vec<PackedSeq>],
    attn: &mut dyn AttentionStage,
) -> Result<Graph> {
    let nanos = attn.nanos().max(1) as usize;
    let mut e = Emitter::new(cost, env, batch, nanos, Span::Whole);
    e.drive(attn, env)?;
    e.pp_edges();
    e.gather_edges();
    e.cx.b.build()
}

/// The step's graph with Ulysses' attention, emitted in parallel: the replicas in up to
/// `parts` parts of consecutive replicas (every replica's ops but the gradient
/// all-reduces, which couple them), then the all-reduces, laid out as one emitter over
/// every replica lays them out ([`crate::engine::parts`]), so the graph is the same for any
/// number of parts and threads.
fn emit_parts(
    cost: &CostModel,
    env: &StepEnv<'_>,
    batch: &[Vec<PackedSeq>],
    split: HeadSplit,
    parts: usize,
) -> Result<Graph> {
    let dp = env.map.par.dp as usize;
    let cs = dp.div_ceil(parts.clamp(1, dp));
    let nq = dp.div_ceil(cs);
    let emitted: Vec<Emitted> = (0..nq)
        .into_par_iter()
        .map(|q| emit_part(cost, env, batch, split, q * cs, cs.min(dp - q * cs)))
        .collect::<Result<_>>()?;
    let (red, marks) = emit_reduce(cost, env, batch, cs, &emitted[0], |q| &emitted[q].ready);
    let waits: Vec<Vec<Vec<OpId>>> = emitted.iter().map(|x| x.waits.clone()).collect();
    let mut all: Vec<Part> = emitted.into_iter().map(|x| x.part).collect();
    let infos = red.cx.b.streams().to_vec();
    all.push(Part {
        b: red.cx.b,
        marks,
        streams: red.stream_map,
    });
    let gathered: Vec<Vec<OpId>> = red
        .stages
        .iter()
        .map(|s| s.bucket_gathered.clone())
        .collect();
    let nbs: Vec<usize> = red.stages.iter().map(|s| s.nb as usize).collect();
    let (mut b, placed) = assemble(infos, all)?;
    for (q, dep, op) in red.ext {
        b.add_dep(placed.op(q as usize, dep), placed.op(nq, op));
    }
    // Each part's first forward ops through a bucket wait for its parameter gather: part
    // q's rank j is rank q · cs · CP · TP + j of the whole step.
    let rw = (env.map.par.cp * env.map.par.tp) as usize;
    for (q, waits) in waits.iter().enumerate() {
        for ((w, g), &nb) in waits.iter().zip(&gathered).zip(&nbs) {
            let off = q * cs * rw * nb;
            for (j, &op) in w.iter().enumerate() {
                if op != NONE && g[off + j] != NONE {
                    b.add_dep(placed.op(nq, g[off + j]), placed.op(q, op));
                }
            }
        }
    }
    b.build()
}

/// The part of Ulysses' step holding replicas [r0, r0 + nr).
fn emit_part(
    cost: &CostModel,
    env: &StepEnv<'_>,
    batch: &[Vec<PackedSeq>],
    split: HeadSplit,
    r0: usize,
    nr: usize,
) -> Result<Emitted> {
    let mut e = Emitter::new(cost, env, batch, 1, Span::Replicas { r0, nr });
    let mut u = UlyssesAttention::part(cost, env.map, batch, split, r0, nr, e.cx.local);
    e.drive(&mut u, env)?;
    e.pp_edges();
    Ok(e.into_part())
}

/// The gradient all-reduces over every replica, in the phases parts of `cs` replicas
/// leave for them (as `first`, the first part, left them), and the end of each phase;
/// `ready(q)`: part q's bucket-ready ops per stage.
fn emit_reduce<'a, 'r>(
    cost: &'a CostModel,
    env: &StepEnv<'a>,
    batch: &'a [Vec<PackedSeq>],
    cs: usize,
    first: &Emitted,
    ready: impl Fn(usize) -> &'r [Vec<OpId>],
) -> (Emitter<'a>, Vec<Mark>) {
    let nq = (env.map.par.dp as usize).div_ceil(cs);
    let mut red = Emitter::new(cost, env, batch, 1, Span::Reduce { cs });
    for (p, st) in red.stages.iter_mut().enumerate() {
        st.bucket_ready = (0..nq).flat_map(|q| ready(q)[p].iter().copied()).collect();
    }
    let mut at = first.reduce_at.iter().peekable();
    let mut marks = Vec::with_capacity(first.part.marks.len());
    for k in 0..first.part.marks.len() {
        if first.gather_at == Some(k) {
            for q in 0..red.nq {
                red.param_gather(q);
            }
        }
        if let Some(&(_, p)) = at.next_if(|x| x.0 == k) {
            red.dp_allreduce(p);
        }
        marks.push(red.cx.b.mark());
    }
    (red, marks)
}

/// What a part of some replicas emitted.
struct Emitted {
    part: Part,
    /// Per stage, per rank of the part and bucket: the op after which the bucket's
    /// gradients are ready.
    ready: Vec<Vec<OpId>>,
    /// The phases (index, stage) left for the stages' gradient all-reduces.
    reduce_at: Vec<(usize, u32)>,
    /// Per stage, per rank of the part and bucket: the first forward op through the
    /// bucket's layers (overlapped parameter gathers; else empty).
    waits: Vec<Vec<OpId>>,
    /// The phase left for the parameter gathers at the start of the step.
    gather_at: Option<usize>,
}

/// Which replicas an [`Emitter`] emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Span {
    /// Every replica and the gradient all-reduces, on the graph's streams.
    Whole,
    /// Replicas [r0, r0 + nr), on streams of the part's own, marking a phase at the end of
    /// every loop over replicas and an empty phase where a gradient all-reduce goes.
    Replicas { r0: usize, nr: usize },
    /// Only the gradient all-reduces, over every replica, on the graph's streams; the ops
    /// they wait for are in the parts of `cs` replicas each ([`Emitter::ext`]).
    Reduce { cs: usize },
}

/// Expert parallelism needs an MoE model whose experts it divides, EP groups inside one
/// replica's TP × CP ranks, and (with TP > 1) sequence parallelism, as Megatron-Core
/// requires for MoE under TP.
pub fn check_moe_layout(m: &crate::cost::ModelConfig, par: super::Parallelism) -> Result<()> {
    use crate::cost::Ffn;
    let hot = par.moe_hot_share;
    if hot != 0.0 {
        let experts = match m.ffn {
            Ffn::Moe { experts, .. } if par.ep > 1 => experts,
            _ => {
                return Err(invalid(
                    "moe_hot_share",
                    hot,
                    "0 unless an MoE model runs with ep > 1 (routing skew moves tokens between EP ranks)",
                ))
            }
        };
        if !(hot.is_finite() && hot >= 1.0 / f64::from(experts) && hot <= 1.0) {
            return Err(invalid(
                "moe_hot_share",
                hot,
                format!(
                    "0 (uniform) or a share in [1/{experts}, 1] of the routed tokens for the hottest expert"
                ),
            ));
        }
    }
    if par.ep <= 1 {
        return Ok(());
    }
    let Ffn::Moe { experts, .. } = m.ffn else {
        return Err(invalid(
            "ep",
            par.ep,
            format!("1 for the dense model {} (EP shards MoE experts)", m.name),
        ));
    };
    if experts % par.ep != 0 {
        return Err(invalid(
            "ep",
            par.ep,
            format!("a divisor of {}'s {experts} experts", m.name),
        ));
    }
    let rw = par.tp * par.cp;
    if rw % par.ep != 0 {
        return Err(invalid(
            "ep",
            par.ep,
            format!(
                "a divisor of TP × CP = {rw} (each EP group lies inside one replica's \
                 tensor- and context-parallel ranks)"
            ),
        ));
    }
    if par.tp > 1 && !par.sp {
        return Err(invalid(
            "sp",
            false,
            "true when an MoE model runs with TP > 1 and EP > 1 (Megatron-Core requires sequence parallelism there)",
        ));
    }
    Ok(())
}

/// Rank `i`'s MoE work under routing skew: expert 0 (on the first rank of each EP group)
/// receives `moe_hot_share` of the group's routed token copies, the other experts the rest
/// evenly, so each rank computes the copies its experts receive. Its dispatch (and, mirrored,
/// its combine) all-to-all sends per peer max(egress, ingress) / (EP − 1) copies: the load on
/// its port (each rank routes `tokens` · top-k copies; those for its own experts stay).
fn skew_experts(cost: &CostModel, d: &mut RankDur, par: super::Parallelism, i: usize, tokens: u64) {
    let crate::cost::Ffn::Moe { experts, .. } = cost.model.ffn else {
        return;
    };
    let (e, ep, hot) = (f64::from(experts), f64::from(par.ep), par.moe_hot_share);
    let per_rank = e / ep;
    let cold = (1.0 - hot) / (e - 1.0);
    let share = if i % par.ep as usize == 0 {
        hot + (per_rank - 1.0) * cold
    } else {
        per_rank * cold
    };
    let copies = tokens * u64::from(cost.top_k());
    let local = (share * copies as f64).round() as u64;
    let received = (share * ep * copies as f64).round() as u64;
    let port = (copies - local.min(copies)).max(received.saturating_sub(local));
    d.experts_f = cost.experts_fwd_ps_f(received).round() as Ps;
    d.ep_pair_bytes = port.div_ceil(u64::from(par.ep) - 1) * cost.ep_copy_bytes();
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
    /// GPU of each rank, by its offset i = (replica · CP + position) · TP + tp_rank.
    groups: Vec<GpuId>,
    /// All-to-all routes of each rank in its EP group, by offset.
    ep_routes: Vec<A2aRoute>,
    /// Per (nano-batch k, rank i) at k·W + i: linear durations of the current slot.
    durs: Vec<RankDur>,
    /// Per replica: its tokens in the current slot.
    tokens: Vec<u64>,
    /// Per (rank, bucket): the op after which the bucket's gradients are ready.
    bucket_ready: Vec<OpId>,
    /// Per (rank, bucket), with the distributed optimizer's overlapped parameter gathers:
    /// the first forward op through the bucket's layers, and the gather it waits for.
    bucket_wait: Vec<OpId>,
    bucket_gathered: Vec<OpId>,
}

/// Emits a step's ops slot by slot and layer by layer, for a [`Span`] of replicas;
/// [`Emitter::drive`] chooses the order (stage by stage, or tick by tick).
struct Emitter<'a> {
    cx: Ctx<'a>,
    cost: &'a CostModel,
    batch: &'a [Vec<PackedSeq>],
    nanos: usize,
    /// Ranks per stage (DP · CP · TP).
    wn: usize,
    /// Pipeline stages (PP) and virtual stages (PP · vp): `stages`, `last` and the slot
    /// arrays are by virtual stage q = chunk · PP + stage, whose GPUs are stage q mod PP's.
    pp: u32,
    nq: u32,
    /// TP group size.
    tp: usize,
    /// Linear work as chains of pieces and TP/EP collectives (TP or EP > 1); else one op
    /// per linear block.
    chain: bool,
    /// Under TP and EP, the shared experts run as a piece of their own between a TP
    /// all-gather and reduce-scatter (the model has shared experts).
    shared_chain: bool,
    stages: Vec<StageState>,
    /// Per stage, nano-batch and rank at (p · nanos + k) · W + i: the rank's last op (the
    /// op its next linear block waits for).
    last: Vec<OpId>,
    /// Per (stage, rank, mb): the first op of each slot and its send, for PP edges.
    f_first: Vec<OpId>,
    f_send: Vec<OpId>,
    b_first: Vec<OpId>,
    b_send: Vec<OpId>,
    /// Which replicas it emits; the first and how many.
    span: Span,
    r0: usize,
    nr: usize,
    /// The graph's stream of each of the builder's streams.
    stream_map: Vec<StreamId>,
    /// Under [`Span::Replicas`]: the end of each phase, and the phases (index, stage) left
    /// for the gradient all-reduces.
    marks: Vec<Mark>,
    reduce_at: Vec<(usize, u32)>,
    gather_at: Option<usize>,
    /// Under [`Span::Reduce`]: each all-reduce part's dependency, in the part of replicas
    /// that holds it: (part, its op, the all-reduce part).
    ext: Vec<(u32, OpId, OpId)>,
}

impl<'a> Emitter<'a> {
    fn new(
        cost: &'a CostModel,
        env: &StepEnv<'a>,
        batch: &'a [Vec<PackedSeq>],
        nanos: usize,
        span: Span,
    ) -> Self {
        let map = env.map;
        let par = map.par;
        let m = &cost.model;
        let (dp, pp, cp, ga, tp) = (par.dp, par.pp, par.cp, par.ga, par.tp);
        let (cpu, dpu, tpu) = (cp as usize, dp as usize, tp as usize);
        let (r0, nr) = match span {
            Span::Replicas { r0, nr } => (r0, nr),
            Span::Whole | Span::Reduce { .. } => (0, dpu),
        };
        let wn = nr * cpu * tpu;
        let chain = tp > 1 || par.ep > 1;
        let shared_chain = tp > 1
            && par.ep > 1
            && matches!(m.ffn, crate::cost::Ffn::Moe { shared_experts, .. } if shared_experts > 0);
        let per_layer = if chain { 20 } else { 8 };
        let ops_est = match span {
            Span::Reduce { .. } => pp as usize * wn * 2 * par.dp_buckets as usize,
            _ => {
                pp as usize
                    * wn
                    * ga as usize
                    * (m.layers as usize / pp as usize + 1)
                    * per_layer
                    * nanos
            }
        } + 16;
        let w = dpu * cpu * tpu;
        let mut cx = Ctx {
            map,
            mb: 0,
            var: env.var,
            step: env.step,
            b: GraphBuilder::with_capacity(ops_est),
            xf: Vec::new(),
            local: match span {
                Span::Replicas { .. } => Some((w as u32, (r0 * cpu * tpu) as u32, wn as u32)),
                _ => None,
            },
        };
        let kinds: &[StreamKind] = if map.streams_per_gpu() == 5 {
            &[
                StreamKind::Compute,
                StreamKind::CpComm,
                StreamKind::PpComm,
                StreamKind::DpComm,
                StreamKind::TpComm,
            ]
        } else {
            &[
                StreamKind::Compute,
                StreamKind::CpComm,
                StreamKind::PpComm,
                StreamKind::DpComm,
            ]
        };
        let mut stream_map = Vec::with_capacity(pp as usize * wn * kinds.len());
        for p in 0..pp {
            let base = map.gpu(p, r0 as u32, 0, 0);
            for g in base..base + wn as u32 {
                for &k in kinds {
                    cx.b.add_stream(g, k);
                    stream_map.push(map.streams_per_gpu() * g + k as u32);
                }
            }
        }
        let epu = par.ep as usize;
        let mut route_buf: Vec<A2aRoute> = Vec::with_capacity(epu);
        let gathers = par.gathers_params_early();
        let chunks = pipeline::chunk_layers(&par, m.layers);
        let nq = chunks.len() as u32;
        let orders: Vec<Vec<pipeline::Slot>> = match par.pipeline {
            PipelineKind::Ticks => Vec::new(),
            _ => (0..pp).map(|p| pipeline::slots(&par, p)).collect(),
        };
        let stages = chunks
            .into_iter()
            .enumerate()
            .map(|(q, (lf, ll))| {
                let (p, c) = (q as u32 % pp, q as u32 / pp);
                let nb = par.dp_buckets.min((ll - lf).max(1));
                let last_bwd_mb = match par.pipeline {
                    PipelineKind::Ticks => ga.checked_sub(1),
                    _ => orders[p as usize]
                        .iter()
                        .rev()
                        .find(|s| !s.fwd && s.chunk == c)
                        .map(|s| s.mb),
                };
                let base = map.gpu(p, r0 as u32, 0, 0);
                let groups: Vec<GpuId> = (0..wn as u32).map(|i| base + i).collect();
                let mut ep_routes = Vec::new();
                if epu > 1 {
                    for grp in groups.chunks(epu) {
                        a2a_pattern(&map.place, grp, &mut route_buf);
                        ep_routes.extend_from_slice(&route_buf);
                    }
                }
                StageState {
                    lf,
                    ll,
                    nb,
                    last_bwd_mb,
                    groups,
                    ep_routes,
                    durs: vec![RankDur::default(); nanos * wn],
                    tokens: vec![0; nr],
                    bucket_ready: vec![NONE; wn * nb as usize],
                    bucket_wait: if gathers {
                        vec![NONE; wn * nb as usize]
                    } else {
                        Vec::new()
                    },
                    bucket_gathered: if gathers {
                        vec![NONE; wn * nb as usize]
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect();
        let nslots = nq as usize * wn * ga as usize;
        Emitter {
            cx,
            cost,
            batch,
            nanos,
            wn,
            pp,
            nq,
            tp: tpu,
            chain,
            shared_chain,
            stages,
            last: vec![NONE; nq as usize * nanos * wn],
            f_first: vec![NONE; nslots],
            f_send: vec![NONE; nslots],
            b_first: vec![NONE; nslots],
            b_send: vec![NONE; nslots],
            span,
            r0,
            nr,
            stream_map,
            marks: Vec::new(),
            reduce_at: Vec::new(),
            gather_at: None,
            ext: Vec::new(),
        }
    }

    /// Under [`Span::Replicas`], the end of a phase (a loop over the replicas).
    fn mark(&mut self) {
        if let Span::Replicas { .. } = self.span {
            self.marks.push(self.cx.b.mark());
        }
    }

    /// Stage p's gradient all-reduce: emitted, or under [`Span::Replicas`] an empty phase
    /// left for it.
    fn reduce(&mut self, p: u32) {
        if let Span::Replicas { .. } = self.span {
            self.mark();
            self.reduce_at.push((self.marks.len(), p));
            self.mark();
        } else {
            self.dp_allreduce(p);
        }
    }

    /// Every slot (or tick) of every stage, and the gradient all-reduces.
    fn drive(&mut self, attn: &mut dyn AttentionStage, env: &StepEnv<'_>) -> Result<()> {
        let par = self.cx.map.par;
        if par.gathers_params_early() {
            if let Span::Replicas { .. } = self.span {
                self.mark();
                self.gather_at = Some(self.marks.len());
                self.mark();
            } else {
                for q in 0..self.nq {
                    self.param_gather(q);
                }
            }
        }
        match par.pipeline {
            PipelineKind::Gpipe | PipelineKind::OneFOneB => {
                for p in 0..par.pp {
                    for s in pipeline::slots(&par, p) {
                        self.slot(s.chunk * par.pp + p, s.fwd, s.mb, attn, env)?;
                    }
                    // A stage's chunks finish their backwards last chunk first.
                    for c in (0..par.vp).rev() {
                        self.reduce(c * par.pp + p);
                    }
                }
            }
            PipelineKind::Ticks => {
                let ticks = crate::balance::distca::pingpong::pp_ticks(par.pp, par.ga)?;
                for (ti, tick) in ticks.iter().enumerate() {
                    self.tick(ti as u32, tick, attn, env)?;
                }
                for p in 0..par.pp {
                    self.reduce(p);
                }
            }
        }
        Ok(())
    }

    /// The part a [`Span::Replicas`] emitter made.
    fn into_part(self) -> Emitted {
        Emitted {
            waits: self.stages.iter().map(|s| s.bucket_wait.clone()).collect(),
            ready: self.stages.into_iter().map(|s| s.bucket_ready).collect(),
            gather_at: self.gather_at,
            part: Part {
                b: self.cx.b,
                marks: self.marks,
                streams: self.stream_map,
            },
            reduce_at: self.reduce_at,
        }
    }

    /// Ranks of one replica on one stage (CP · TP).
    fn rw(&self) -> usize {
        self.cx.map.par.cp as usize * self.tp
    }

    fn idx(&self, p: u32, i: usize, mb: u32) -> usize {
        let ga = self.cx.map.par.ga as usize;
        (p as usize * self.wn + i) * ga + mb as usize
    }

    fn li(&self, p: u32, k: usize, i: usize) -> usize {
        (p as usize * self.nanos + k) * self.wn + i
    }

    /// The slot's durations (and, under TP or EP, its chain's pieces and bytes).
    fn begin(&mut self, p: u32, mb: u32) {
        let par = self.cx.map.par;
        let (cp, cpu, tp) = (par.cp, par.cp as usize, self.tp);
        let last_stage = p + 1 == self.nq;
        let (cost, nanos, wn, chain, shared_chain) = (
            self.cost,
            self.nanos,
            self.wn,
            self.chain,
            self.shared_chain,
        );
        let seq_shard = if par.sp { tp as u64 } else { 1 };
        let ep = u64::from(par.ep);
        let (r0, nr) = (self.r0, self.nr);
        let st = &mut self.stages[p as usize];
        for r in 0..nr {
            let seq = &self.batch[r0 + r][mb as usize];
            st.tokens[r] = seq.tokens();
            for c in 0..cpu {
                let t = chunk(st.tokens[r], cp, c as u32);
                for k in 0..nanos {
                    let t = chunk(t, nanos as u32, k as u32);
                    let mut d = RankDur {
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
                        ..RankDur::default()
                    };
                    if chain {
                        let nt = t.div_ceil(seq_shard);
                        let ps = |x: f64| x.round() as Ps;
                        d.qkv_f = ps(cost.piece_fwd_ps_f(LinearPiece::Qkv, t, nt));
                        d.oproj_f = ps(cost.piece_fwd_ps_f(LinearPiece::OutProj, t, nt));
                        d.tp_bytes = cost.hidden_bytes(t);
                        if ep > 1 {
                            // The MoE block runs on the rank's own (sequence-parallel) tokens:
                            // each sends top-k copies, (EP−1)/EP of them to its EP peers, and
                            // receives as many under uniform routing. Shared experts, split
                            // by TP, run on the TP group's tokens: under TP a piece of their
                            // own between an all-gather and a reduce-scatter.
                            let tin = t.div_ceil(tp as u64);
                            let copies = tin * u64::from(cost.top_k());
                            let router = cost.piece_fwd_ps_f(LinearPiece::Router, tin, tin);
                            let shared = cost.shared_experts_fwd_ps_f(t);
                            if shared_chain {
                                (d.ffn_f, d.shared_f) = (ps(router), ps(shared));
                            } else {
                                d.ffn_f = ps(router + shared);
                            }
                            d.experts_f = ps(cost.experts_fwd_ps_f(copies));
                            d.ep_pair_bytes = copies.div_ceil(ep) * cost.ep_copy_bytes();
                        } else {
                            d.ffn_f = ps(cost.piece_fwd_ps_f(LinearPiece::Ffn, t, nt));
                        }
                    }
                    for lane in 0..tp {
                        let i = (r * cpu + c) * tp + lane;
                        let mut d = d;
                        if par.moe_hot_share > 0.0 {
                            skew_experts(cost, &mut d, par, i, t.div_ceil(tp as u64));
                        }
                        st.durs[k * wn + i] = d;
                    }
                }
            }
        }
    }

    /// The links of the block after layer l's attention (O projection, feed-forward):
    /// with SP a reduce-scatter after the O projection and an all-gather + reduce-scatter
    /// around the MLP (without SP, two all-reduces); under EP the router, the dispatch, the
    /// experts and the combine instead of the MLP, then under TP the shared experts (a
    /// TP-split dense MLP, as Megatron's `SharedExpertMLP`) between an all-gather and a
    /// reduce-scatter.
    fn links_post(&self) -> Vec<Link> {
        let par = self.cx.map.par;
        let (tp, sp) = (par.tp > 1, par.sp);
        let red = if sp { Link::Rs } else { Link::Ar };
        let mut v = vec![Link::Gemm(Piece::OutProj)];
        if tp {
            v.push(red);
        }
        if par.ep > 1 {
            v.extend([
                Link::Gemm(Piece::Ffn),
                Link::Ep,
                Link::Gemm(Piece::Experts),
                Link::Ep,
            ]);
            if self.shared_chain {
                v.extend([Link::Ag, Link::Gemm(Piece::Shared), Link::Rs]);
            }
        } else {
            if tp && sp {
                v.push(Link::Ag);
            }
            v.push(Link::Gemm(Piece::Ffn));
            if tp {
                v.push(red);
            }
        }
        v
    }

    /// Layer l's linear chain: the block after layer l − 1's attention (`after_attn`: not
    /// on a stage's first layer), then the QKV projection.
    fn layer_links(&self, after_attn: bool) -> Vec<Link> {
        let mut v = if after_attn {
            self.links_post()
        } else {
            Vec::new()
        };
        v.extend(self.links_gathered(Piece::Qkv));
        v
    }

    /// A stage's closing chain: the block after its last attention, then (last stage) the
    /// LM head.
    fn end_links(&self, last_stage: bool) -> Vec<Link> {
        let mut v = self.links_post();
        if last_stage {
            v.extend(self.links_gathered(Piece::Head));
        }
        v
    }

    /// The links before a piece that needs the whole sequence's activation (the QKV
    /// projection, the LM head): an all-gather under SP.
    fn links_gathered(&self, piece: Piece) -> Vec<Link> {
        let par = self.cx.map.par;
        let mut v = Vec::with_capacity(2);
        if par.tp > 1 && par.sp {
            v.push(Link::Ag);
        }
        v.push(Link::Gemm(piece));
        v
    }

    /// Replica r's ranks run `links` (forward order; backward reversed and transposed)
    /// for nano-batch after nano-batch: each piece a kernel on the compute stream, each
    /// collective one per TP group (or EP group) on the TP stream. Returns, per rank of the
    /// replica, its first op (for pipeline edges).
    fn chain(&mut self, p: u32, mb: u32, l: u32, r: usize, links: &[Link], fwd: bool) -> Vec<OpId> {
        self.cx.mb = mb;
        let par = self.cx.map.par;
        let (tp, rec) = (self.tp, par.recompute.full());
        let rw = self.rw();
        let base = r * rw;
        let ep = par.ep as usize;
        let lab = |class| OpLabel {
            class,
            mb: mb as u16,
            layer: l as u16,
        };
        let mut first = vec![NONE; rw];
        let order: Vec<Link> = if fwd {
            links.to_vec()
        } else {
            links
                .iter()
                .rev()
                .map(|&x| match x {
                    Link::Ag => Link::Rs,
                    Link::Rs => Link::Ag,
                    o => o,
                })
                .collect()
        };
        // Backward collectives also carry the recomputed forward's.
        let mult = if !fwd && rec { 2 } else { 1 };
        let lin = if fwd {
            OpClass::LinearFwd
        } else {
            OpClass::LinearBwd
        };
        // Under tp-comm-overlap a TP collective runs beside the GEMM next to it (a gather
        // beside the GEMM after it, a reduction beside the GEMM before it), pipelined chunk
        // by chunk: both start from the same predecessor and a zero-time join on the
        // compute stream waits for both.
        let overlap = par.tp_overlap;
        let is_gemm = |x: Option<&Link>| matches!(x, Some(Link::Gemm(_)));
        let mut gemm_dep = vec![NONE; rw];
        let mut lead = vec![NONE; rw];
        for k in 0..self.nanos {
            for (x, &link) in order.iter().enumerate() {
                let tp_link = matches!(link, Link::Ag | Link::Rs | Link::Ar);
                let lead_coll = overlap && tp_link && is_gemm(order.get(x + 1));
                let trail_coll =
                    overlap && tp_link && !lead_coll && x > 0 && is_gemm(order.get(x - 1));
                match link {
                    Link::Gemm(piece) => {
                        for (j, f0) in first.iter_mut().enumerate() {
                            let i = base + j;
                            let st = &self.stages[p as usize];
                            let (g, d) = (st.groups[i], st.durs[k * self.wn + i]);
                            let f = match piece {
                                Piece::Qkv => d.qkv_f,
                                Piece::OutProj => d.oproj_f,
                                Piece::Ffn => d.ffn_f,
                                Piece::Experts => d.experts_f,
                                Piece::Shared => d.shared_f,
                                Piece::Head => d.head_f,
                            };
                            let head = piece == Piece::Head;
                            let (class, dur) = match (fwd, head) {
                                (true, false) => (OpClass::LinearFwd, f),
                                (true, true) => (OpClass::HeadFwd, f),
                                (false, h) => (
                                    if h {
                                        OpClass::HeadBwd
                                    } else {
                                        OpClass::LinearBwd
                                    },
                                    2 * f + if rec { f } else { 0 },
                                ),
                            };
                            let dur = self.cx.vary(g, l, class, dur);
                            let li = self.li(p, k, i);
                            gemm_dep[j] = self.last[li];
                            let op = self.cx.compute(g, dur, lab(class), deps(&self.last[li]));
                            self.last[li] = op;
                            if *f0 == NONE {
                                *f0 = op;
                            }
                            if lead[j] != NONE {
                                let join = self.cx.compute(g, 0, lab(lin), &[lead[j]]);
                                self.last[li] = join;
                                lead[j] = NONE;
                            }
                        }
                    }
                    Link::Ag | Link::Rs | Link::Ar | Link::Ep => {
                        let size = if link == Link::Ep { ep } else { tp };
                        for g0 in (0..rw).step_by(size) {
                            let st = &self.stages[p as usize];
                            let d = st.durs[k * self.wn + base + g0];
                            let coll = if link == Link::Ep {
                                let routes = &st.ep_routes[base + g0..base + g0 + size];
                                let bytes: Vec<u64> = (0..size)
                                    .map(|q| {
                                        mult * st.durs[k * self.wn + base + g0 + q].ep_pair_bytes
                                    })
                                    .collect();
                                let routes = routes.to_vec();
                                self.cx.all_to_all(&routes, &bytes)
                            } else {
                                let gpus = st.groups[base + g0..base + g0 + size].to_vec();
                                let op = match link {
                                    Link::Ag => CollOp::AllGather,
                                    Link::Rs => CollOp::ReduceScatter,
                                    _ => CollOp::AllReduce,
                                };
                                self.cx.collective(op, &gpus, mult * d.tp_bytes)
                            };
                            let class = if link == Link::Ep {
                                OpClass::EpA2a
                            } else {
                                OpClass::TpComm
                            };
                            for (j, f0) in first.iter_mut().enumerate().skip(g0).take(size) {
                                let i = base + j;
                                let g = self.stages[p as usize].groups[i];
                                let li = self.li(p, k, i);
                                // A gather beside a GEMM needs a predecessor both wait for.
                                let lead_here = lead_coll && self.last[li] != NONE;
                                let dep = if trail_coll {
                                    gemm_dep[j]
                                } else {
                                    self.last[li]
                                };
                                let op = self.cx.b.add_op(
                                    self.cx.stream(g, StreamKind::TpComm),
                                    OpKind::Coll(coll),
                                    lab(class),
                                    deps(&dep),
                                );
                                if lead_here {
                                    lead[j] = op;
                                } else if trail_coll {
                                    self.last[li] = self.cx.compute(g, 0, lab(lin), &[op]);
                                } else {
                                    self.last[li] = op;
                                }
                                if *f0 == NONE {
                                    *f0 = op;
                                }
                            }
                        }
                    }
                }
            }
        }
        first
    }

    fn fwd_linear(&mut self, p: u32, mb: u32, l: u32, r: usize) {
        let lf = self.stages[p as usize].lf;
        let rw = self.rw();
        let wait_bucket = self.bucket_starting_at(p, mb, l);
        if self.chain {
            let links = self.layer_links(l > lf);
            let first = self.chain(p, mb, l, r, &links, true);
            for (j, &op) in first.iter().enumerate() {
                if l == lf {
                    let i = self.idx(p, r * rw + j, mb);
                    self.f_first[i] = op;
                }
                if let Some(bk) = wait_bucket {
                    let nb = self.stages[p as usize].nb as usize;
                    self.stages[p as usize].bucket_wait[(r * rw + j) * nb + bk] = op;
                }
            }
            return;
        }
        self.cx.mb = mb;
        let lab = OpLabel {
            class: OpClass::LinearFwd,
            mb: mb as u16,
            layer: l as u16,
        };
        for i in r * rw..(r + 1) * rw {
            let g = self.stages[p as usize].groups[i];
            for k in 0..self.nanos {
                let d = self.stages[p as usize].durs[k * self.wn + i];
                let li = self.li(p, k, i);
                let base = d.pre_f + if l > lf { d.post_f } else { 0 };
                let dur = self.cx.vary(g, l, OpClass::LinearFwd, base);
                let op = self.cx.compute(g, dur, lab, deps(&self.last[li]));
                if l == lf && k == 0 {
                    let s = self.idx(p, i, mb);
                    self.f_first[s] = op;
                }
                if let (Some(bk), 0) = (wait_bucket, k) {
                    let nb = self.stages[p as usize].nb as usize;
                    self.stages[p as usize].bucket_wait[i * nb + bk] = op;
                }
                self.last[li] = op;
            }
        }
    }

    fn fwd_end(&mut self, p: u32, mb: u32) {
        self.cx.mb = mb;
        let last_stage = p + 1 == self.nq;
        let ll = self.stages[p as usize].ll;
        let lab = |class| OpLabel {
            class,
            mb: mb as u16,
            layer: (ll - 1) as u16,
        };
        if self.chain {
            for r in 0..self.nr {
                let links = self.end_links(last_stage);
                self.chain(p, mb, ll, r, &links, true);
            }
            self.mark();
        }
        for i in 0..self.wn {
            let g = self.stages[p as usize].groups[i];
            // Under a chain the closing block is emitted; its last op is the send's input.
            let mut op = self.last[self.li(p, self.nanos - 1, i)];
            for k in (0..self.nanos).filter(|_| !self.chain) {
                let li = self.li(p, k, i);
                let d = self.stages[p as usize].durs[k * self.wn + i];
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
                let s = self.pp_send(p, p + 1, i, lab(OpClass::PpSendFwd), op);
                let x = self.idx(p, i, mb);
                self.f_send[x] = s;
            }
        }
        self.mark();
    }

    /// Rank i's activation (or gradient) to stage `to`: the hidden state of its CP chunk,
    /// of which each TP rank sends its 1/TP (sequence parallelism, or Megatron's
    /// scatter-gather of pipeline tensors without it).
    fn pp_send(&mut self, p: u32, to: u32, i: usize, label: OpLabel, dep: OpId) -> OpId {
        let par = self.cx.map.par;
        let (cpu, tp) = (par.cp as usize, self.tp);
        let (r, c) = (i / (cpu * tp), (i / tp) % cpu);
        let src = self.stages[p as usize].groups[i];
        let dst = self.cx.map.gpu(to % self.pp, self.r0 as u32, 0, 0) + i as GpuId;
        let tokens = self.stages[p as usize].tokens[r];
        let bytes = self
            .cost
            .hidden_bytes(chunk(tokens, par.cp, c as u32))
            .div_ceil(tp as u64);
        let x = self.cx.b.add_xfer(Xfer { src, dst, bytes });
        let s = self.cx.stream(src, StreamKind::PpComm);
        self.cx.b.add_op(s, OpKind::Send(x), label, &[dep])
    }

    fn bwd_begin(&mut self, p: u32, mb: u32) {
        self.cx.mb = mb;
        let par = self.cx.map.par;
        let rec = par.recompute.full();
        let rw = self.rw();
        let last_stage = p + 1 == self.nq;
        let ll = self.stages[p as usize].ll;
        let lab = |class| OpLabel {
            class,
            mb: mb as u16,
            layer: (ll - 1) as u16,
        };
        if self.chain {
            for r in 0..self.nr {
                let links = self.end_links(last_stage);
                let first = self.chain(p, mb, ll, r, &links, false);
                for (j, op) in first.into_iter().enumerate() {
                    let i = self.idx(p, r * rw + j, mb);
                    self.b_first[i] = op;
                }
            }
            self.mark();
            return;
        }
        for i in 0..self.wn {
            let g = self.stages[p as usize].groups[i];
            let mut first = NONE;
            for k in 0..self.nanos {
                let d = self.stages[p as usize].durs[k * self.wn + i];
                let li = self.li(p, k, i);
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
            let x = self.idx(p, i, mb);
            self.b_first[x] = first;
        }
        self.mark();
    }

    fn bwd_linear(&mut self, p: u32, mb: u32, l: u32, r: usize, done: u32) {
        self.cx.mb = mb;
        let par = self.cx.map.par;
        let rec = par.recompute.full();
        let rw = self.rw();
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
        if self.chain {
            let links = self.layer_links(l > lf);
            self.chain(p, mb, l, r, &links, false);
        }
        for i in r * rw..(r + 1) * rw {
            let g = self.stages[p as usize].groups[i];
            let mut op = self.last[self.li(p, self.nanos - 1, i)];
            for k in (0..self.nanos).filter(|_| !self.chain) {
                let li = self.li(p, k, i);
                let d = self.stages[p as usize].durs[k * self.wn + i];
                let mut base = d.pre_b + if l > lf { d.post_b } else { 0 };
                if rec {
                    base += d.pre_f + if l > lf { d.post_f } else { 0 };
                }
                let dur = self.cx.vary(g, l, OpClass::LinearBwd, base);
                op = self.cx.compute(g, dur, lab, &[self.last[li]]);
                self.last[li] = op;
            }
            if last_mb_slot {
                let i = i as u32;
                for bk in 0..nb {
                    if done == ((bk + 1) * n_layers).div_ceil(nb) {
                        self.stages[p as usize].bucket_ready[(i * nb + bk) as usize] = op;
                    }
                }
            }
        }
    }

    fn bwd_end(&mut self, p: u32, mb: u32) {
        if p == 0 {
            return;
        }
        self.cx.mb = mb;
        let lab = OpLabel {
            class: OpClass::PpSendBwd,
            mb: mb as u16,
            layer: self.stages[p as usize].lf as u16,
        };
        for i in 0..self.wn {
            let li = self.li(p, self.nanos - 1, i);
            let s = self.pp_send(p, p - 1, i, lab, self.last[li]);
            let x = self.idx(p, i, mb);
            self.b_send[x] = s;
        }
        self.mark();
    }

    /// A stage's attention of (stage p, layer l, mb), over stage p's ranks: of replica
    /// `r` of the span (a per-replica stage) or of every replica (`None`).
    #[allow(clippy::too_many_arguments)]
    fn stage_attn(
        &mut self,
        a: &mut dyn AttentionStage,
        env: &StepEnv<'_>,
        p: u32,
        l: u32,
        mb: u32,
        fwd: bool,
        r: Option<usize>,
    ) -> Result<()> {
        let call = AttnCall {
            stage: p % self.pp,
            layer: l,
            mb,
            replica: r.map(|r| (self.r0 + r) as u32),
            fwd,
            recompute: self.cx.map.par.recompute.attention(),
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
        attn: &mut dyn AttentionStage,
        env: &StepEnv<'_>,
    ) -> Result<()> {
        self.begin(p, mb);
        let (lf, ll) = (self.stages[p as usize].lf, self.stages[p as usize].ll);
        let per = attn.per_replica();
        if fwd {
            for l in lf..ll {
                for r in 0..self.nr {
                    self.fwd_linear(p, mb, l, r);
                    if per {
                        self.stage_attn(attn, env, p, l, mb, true, Some(r))?;
                    }
                }
                self.mark();
                if !per {
                    self.stage_attn(attn, env, p, l, mb, true, None)?;
                }
            }
            self.fwd_end(p, mb);
        } else {
            self.bwd_begin(p, mb);
            for (k, l) in (lf..ll).rev().enumerate() {
                if !per {
                    self.stage_attn(attn, env, p, l, mb, false, None)?;
                }
                for r in 0..self.nr {
                    if per {
                        self.stage_attn(attn, env, p, l, mb, false, Some(r))?;
                    }
                    self.bwd_linear(p, mb, l, r, k as u32 + 1);
                }
                self.mark();
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
        attn: &mut dyn AttentionStage,
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
        let per = attn.per_replica();
        let pooled = !per && attn.pooled();
        let layers = self.stages[0].ll - self.stages[0].lf;
        for &(p, mb) in &active {
            self.begin(p, mb);
            if !fwd {
                self.bwd_begin(p, mb);
            }
        }
        for j in 0..layers {
            if !fwd && pooled {
                self.pooled_attn(attn, env, ti, j, false)?;
            }
            for &(p, mb) in &active {
                let st = &self.stages[p as usize];
                let l = if fwd { st.lf + j } else { st.ll - 1 - j };
                if !fwd && !pooled && !per {
                    self.stage_attn(attn, env, p, l, mb, false, None)?;
                }
                for r in 0..self.nr {
                    if fwd {
                        self.fwd_linear(p, mb, l, r);
                    }
                    if per {
                        self.stage_attn(attn, env, p, l, mb, fwd, Some(r))?;
                    }
                    if !fwd {
                        self.bwd_linear(p, mb, l, r, j + 1);
                    }
                }
                self.mark();
                if fwd && !pooled && !per {
                    self.stage_attn(attn, env, p, l, mb, true, None)?;
                }
            }
            if fwd && pooled {
                self.pooled_attn(attn, env, ti, j, true)?;
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
            replica: None,
            fwd,
            recompute: self.cx.map.par.recompute.attention(),
        };
        a.emit(&mut self.cx.b, env, call, &mut self.last)
    }

    /// With overlapped parameter gathers, the bucket whose first forward layer is layer l
    /// of virtual stage p in its first forward slot (micro-batch 0): buckets count from
    /// the stage's last layer, as its backward makes them ready.
    fn bucket_starting_at(&self, p: u32, mb: u32, l: u32) -> Option<usize> {
        let st = &self.stages[p as usize];
        if st.bucket_wait.is_empty() || mb != 0 {
            return None;
        }
        let n = st.ll - st.lf;
        (0..st.nb)
            .find_map(|bk| (st.lf + n - ((bk + 1) * n).div_ceil(st.nb) == l).then_some(bk as usize))
    }

    /// Stage p's data-parallel groups (by offset) and the gradient bytes each reduces:
    /// dense parameters per TP lane over its DP × CP ranks (every parameter when EP = 1)
    /// and, under EP, the experts over each expert-data-parallel group (the ranks holding
    /// the same experts).
    fn dp_groups(&self, p: u32) -> Vec<(Vec<usize>, u64)> {
        let ep = self.cx.map.par.ep as usize;
        let st = &self.stages[p as usize];
        let m = &self.cost.model;
        let g = self.cx.map.par.grad_bytes_per_param();
        let all = stage_params(m, st.ll - st.lf, p == 0, p + 1 == self.nq) * g;
        let experts = if ep > 1 {
            stage_expert_params(m, st.ll - st.lf) * g
        } else {
            0
        };
        let mut groups: Vec<(Vec<usize>, u64)> = (0..self.tp)
            .map(|t| ((t..self.wn).step_by(self.tp).collect(), all - experts))
            .collect();
        if ep > 1 {
            groups.extend((0..ep).map(|e| {
                (
                    (e..self.wn).step_by(ep).collect(),
                    experts.div_ceil(ep as u64),
                )
            }));
        }
        groups.retain(|(ranks, _)| ranks.len() > 1);
        groups
    }

    /// The parameter bytes (the model's dtype) of `grad_bytes` of gradients.
    fn param_bytes(&self, grad_bytes: u64) -> u64 {
        grad_bytes / self.cx.map.par.grad_bytes_per_param() * u64::from(self.cost.model.dtype_bytes)
    }

    /// Stage p's gradient reduction, bucket by bucket, each bucket once the last
    /// micro-batch's backward has made it: one all-reduce per group, or with the
    /// distributed optimizer a reduce-scatter of the gradients followed (unless the
    /// gathers are overlapped with the next step's forward: [`Emitter::param_gather`]) by
    /// an all-gather of the updated parameters.
    fn dp_allreduce(&mut self, p: u32) {
        let par = self.cx.map.par;
        let nb = self.stages[p as usize].nb;
        let groups = self.dp_groups(p);
        let lab = dp_label;
        for bk in 0..nb {
            for (ranks, bytes) in &groups {
                let gpus: Vec<GpuId> = ranks
                    .iter()
                    .map(|&i| self.stages[p as usize].groups[i])
                    .collect();
                let grads = chunk(*bytes, nb, bk);
                let mut colls = Vec::with_capacity(2);
                if par.distributed_optimizer {
                    colls.push(self.cx.collective(CollOp::ReduceScatter, &gpus, grads));
                    if !par.gathers_params_early() {
                        let params = self.param_bytes(grads);
                        colls.push(self.cx.collective(CollOp::AllGather, &gpus, params));
                    }
                } else {
                    colls.push(self.cx.all_reduce(&gpus, grads));
                }
                for (&i, &g) in ranks.iter().zip(&gpus) {
                    let ready = self.stages[p as usize].bucket_ready[i * nb as usize + bk as usize];
                    let s = self.cx.stream(g, StreamKind::DpComm);
                    for (c, &coll) in colls.iter().enumerate() {
                        let dep = if c == 0 { ready } else { NONE };
                        if let Span::Reduce { cs } = self.span {
                            let op = self.cx.b.add_op(s, OpKind::Coll(coll), lab(bk), &[]);
                            if dep != NONE {
                                let part = i / (self.rw() * cs);
                                self.ext.push((part as u32, dep, op));
                            }
                        } else {
                            self.cx.b.add_op(s, OpKind::Coll(coll), lab(bk), deps(&dep));
                        }
                    }
                }
            }
        }
    }

    /// Stage p's parameter all-gathers at the start of the step (the distributed
    /// optimizer's `overlap_param_gather`), in the order the forward needs the buckets;
    /// each bucket's first forward op waits for its gather ([`Emitter::gather_edges`]).
    fn param_gather(&mut self, p: u32) {
        let nb = self.stages[p as usize].nb;
        let groups = self.dp_groups(p);
        let lab = dp_label;
        for bk in (0..nb).rev() {
            for (ranks, bytes) in &groups {
                let gpus: Vec<GpuId> = ranks
                    .iter()
                    .map(|&i| self.stages[p as usize].groups[i])
                    .collect();
                let params = self.param_bytes(chunk(*bytes, nb, bk));
                let coll = self.cx.collective(CollOp::AllGather, &gpus, params);
                for (&i, &g) in ranks.iter().zip(&gpus) {
                    let s = self.cx.stream(g, StreamKind::DpComm);
                    let op = self.cx.b.add_op(s, OpKind::Coll(coll), lab(bk), &[]);
                    self.stages[p as usize].bucket_gathered[i * nb as usize + bk as usize] = op;
                }
            }
        }
    }

    /// Every bucket's first forward op after its parameter gather (one emitter over the
    /// whole step; parts of replicas leave their waits to [`emit_parts`]).
    fn gather_edges(&mut self) {
        for st in &self.stages {
            for (&g, &w) in st.bucket_gathered.iter().zip(&st.bucket_wait) {
                if g != NONE && w != NONE {
                    self.cx.b.add_dep(g, w);
                }
            }
        }
    }

    /// Pipeline edges: a virtual stage's forward waits for the previous one's activations,
    /// its backward for the next one's gradients.
    fn pp_edges(&mut self) {
        let (pp, ga) = (self.nq, self.cx.map.par.ga);
        for p in 0..pp {
            for i in 0..self.wn {
                for mb in 0..ga {
                    if p > 0 {
                        let (s, f) = (self.idx(p - 1, i, mb), self.idx(p, i, mb));
                        self.cx.b.add_dep(self.f_send[s], self.f_first[f]);
                    }
                    if p + 1 < pp {
                        let (s, f) = (self.idx(p + 1, i, mb), self.idx(p, i, mb));
                        self.cx.b.add_dep(self.b_send[s], self.b_first[f]);
                    }
                }
            }
        }
    }
}

/// The label of bucket `bk`'s data-parallel collectives (gradient reduction, parameter
/// gather).
fn dp_label(bk: u32) -> OpLabel {
    OpLabel {
        class: OpClass::DpAllReduce,
        mb: u16::MAX,
        layer: bk as u16,
    }
}

/// No dependency for "none yet" ([`NONE`]), else the one op.
fn deps(op: &OpId) -> &[OpId] {
    if *op == NONE {
        &[]
    } else {
        std::slice::from_ref(op)
    }
}

/// The heads one rank's attention holds on CP `cp`: Ulysses' whole-head split (an error
/// where CP does not divide the heads), or with a plugged attention stage (`plugged`) the
/// rounded-up share.
pub fn attn_split(m: &ModelConfig, cp: u32, plugged: bool) -> Result<HeadSplit> {
    match head_split(m.heads_q, m.heads_kv, cp) {
        Ok(s) => Ok(s),
        Err(e) if !plugged => Err(e),
        Err(_) => Ok(HeadSplit {
            q: m.heads_q.div_ceil(cp),
            kv: m.heads_kv.div_ceil(cp).max(1),
        }),
    }
}

fn rank_memory_of(
    cost: &CostModel,
    map: &RankMap,
    chunks: &[(u32, u32)],
    split: HeadSplit,
    batch: &[Vec<PackedSeq>],
    at: Coords,
) -> MemoryBreakdown {
    let cap = batch[at.dp as usize]
        .iter()
        .map(|s| u64::from(s.capacity))
        .max()
        .unwrap_or(0);
    stage_rank_memory(cost, map.par, chunks, at.pp, split, cap)
}

/// Peak memory of a rank of pipeline stage `pp_stage` under `par` (`chunks`: every virtual
/// stage's layers, [`pipeline::chunk_layers`]), its micro-batches holding sequences of up
/// to `cap` tokens; `cost` prices one TP rank.
pub fn stage_rank_memory(
    cost: &CostModel,
    par: Parallelism,
    chunks: &[(u32, u32)],
    pp_stage: u32,
    split: HeadSplit,
    cap: u64,
) -> MemoryBreakdown {
    let n_layers = pipeline::stage_layer_count(chunks, par.pp, pp_stage);
    let grad_bytes = stage_rank_params(
        &cost.model,
        n_layers,
        pp_stage == 0,
        pp_stage + 1 == par.pp,
        par.ep,
    ) * par.grad_bytes_per_param();
    rank_memory(
        &cost.model,
        &MemoryInputs {
            layers: n_layers,
            first_stage: pp_stage == 0,
            last_stage: pp_stage + 1 == par.pp,
            zero_stage: par.zero_stage.max(u8::from(par.distributed_optimizer)),
            shard_degree: par.dp * par.cp,
            tokens_per_rank: cap.div_ceil(u64::from(par.cp)),
            attn_tokens: cap,
            attn_heads_q: split.q,
            attn_heads_kv: split.kv,
            held_layers: pipeline::held_layers(&par, chunks, pp_stage),
            recompute: par.recompute,
            grad_fp32: par.grad_reduce_in_fp32,
            bucket_bytes: if par.dp * par.cp > 1 {
                grad_bytes.div_ceil(u64::from(par.dp_buckets))
            } else {
                0
            },
            seq_shard: if par.sp { par.tp } else { 1 },
            expert_shard: par.ep,
            fp8: cost.precision == crate::cost::gpu::Precision::Fp8,
        },
    )
}

mod timed;
pub use timed::{run_step, StepRun};

#[cfg(test)]
mod tests;
