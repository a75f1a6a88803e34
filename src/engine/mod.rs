//! The discrete-event core: runs an op graph on GPU streams and a network model.
//!
//! Owns the [`Graph`] (ops, their dependencies, the stream each runs on, collectives and
//! their transfers) and [`run`], which executes it and records the start and end of every
//! op. It knows nothing of models, parallelism or schedules (that is `schedule/`) and
//! nothing of links (that is the [`NetworkModel`] it is handed).
//!
//! # Simulation lifecycle
//! 1. A schedule builds a [`Graph`] with [`GraphBuilder`]: streams (per GPU: compute and
//!    communication streams), ops on them in issue order, explicit cross-stream
//!    dependencies, collectives with their point-to-point transfers.
//! 2. [`run`] executes it. A stream behaves like a CUDA stream: its ops run one at a time
//!    in issue order; an op starts when it is its stream's head, the stream is idle and
//!    all its dependencies have ended. Ops on different streams of one GPU overlap (compute
//!    and communication overlap whenever the graph allows it).
//! 3. Op kinds: `Compute` takes a fixed duration; `Send` moves bytes through the network
//!    model; `Coll` is one GPU's part in a collective: the part *arrives* when it starts,
//!    the collective's transfers start when the last part has arrived (the time between is
//!    that GPU's synchronisation wait), and every part ends when the last transfer lands
//!    (plus the collective's own latency, [`GraphBuilder::add_collective_with_latency`]).
//!    A *grouped point-to-point* collective (an NCCL group of sends and receives,
//!    [`GraphBuilder::add_grouped_p2p`]) couples a part only to the GPUs it exchanges data
//!    with: its transfers start when it and every peer have arrived, and it ends when its
//!    own transfers and every peer's have landed — no barrier across the whole group.
//!
//! # Performance
//! With a network model whose transfer durations are fixed by the transfer alone (the
//! analytical model), [`run`] needs no events: [`dag::run_dag`] times the graph by one
//! parallel sweep in topological order, equal to the event engine to the picosecond. With
//! the flow model, [`run_events`] runs: on a graph whose replicas' flows cross disjoint links
//! until the DP all-reduces couple them, part by part in parallel and then joined
//! (`split`), equal to the whole graph's run to the picosecond.
//! Events are small `Copy` values in one `BinaryHeap` keyed by (time, sequence number), so
//! equal times pop in FIFO order and runs are deterministic. All state lives in `Vec`s
//! indexed by op, stream and collective ids (arena style); nothing is allocated per event.
//!
//! Architecture invariant: simulated time is integer picoseconds and every tie is broken
//! by (time, sequence number), so the same graph and network give the same timeline.

pub mod dag;
pub mod parts;
mod split;
pub mod stub_net;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use rayon::prelude::*;

use crate::error::{invalid, Result};
use crate::net::{GpuId, NetworkModel, Ps};

/// Index of an op in a [`Graph`].
pub type OpId = u32;
/// Index of a stream in a [`Graph`].
pub type StreamId = u32;
/// Index of a collective in a [`Graph`].
pub type CollId = u32;

/// What an op is, for reports and traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum OpClass {
    /// Linear work of a layer (norms, projections, MLP/experts), forward.
    LinearFwd,
    /// Linear work, backward.
    LinearBwd,
    /// Core attention, forward.
    AttnFwd,
    /// Core attention, backward.
    AttnBwd,
    /// Embedding / LM head / loss, forward.
    HeadFwd,
    /// Embedding / LM head / loss, backward.
    HeadBwd,
    /// Context-parallel all-to-all before attention (Q/K/V; in backward dO).
    A2aIn,
    /// Context-parallel all-to-all after attention (output; in backward dQ/dK/dV).
    A2aOut,
    /// Pipeline activation send (forward).
    PpSendFwd,
    /// Pipeline gradient send (backward).
    PpSendBwd,
    /// Data-parallel gradient all-reduce (one bucket).
    DpAllReduce,
    /// Optimizer step.
    Optimizer,
    /// Tensor-parallel all-gather, reduce-scatter or all-reduce of a layer's activations.
    TpComm,
    /// Expert-parallel token dispatch or combine all-to-all of an MoE layer.
    EpA2a,
}

impl OpClass {
    /// Every class, in order.
    pub const ALL: [OpClass; 14] = [
        OpClass::LinearFwd,
        OpClass::LinearBwd,
        OpClass::AttnFwd,
        OpClass::AttnBwd,
        OpClass::HeadFwd,
        OpClass::HeadBwd,
        OpClass::A2aIn,
        OpClass::A2aOut,
        OpClass::PpSendFwd,
        OpClass::PpSendBwd,
        OpClass::DpAllReduce,
        OpClass::Optimizer,
        OpClass::TpComm,
        OpClass::EpA2a,
    ];

    /// The name traces and CSVs use.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::LinearFwd => "linear_fwd",
            OpClass::LinearBwd => "linear_bwd",
            OpClass::AttnFwd => "attn_fwd",
            OpClass::AttnBwd => "attn_bwd",
            OpClass::HeadFwd => "head_fwd",
            OpClass::HeadBwd => "head_bwd",
            OpClass::A2aIn => "a2a_in",
            OpClass::A2aOut => "a2a_out",
            OpClass::PpSendFwd => "pp_send_fwd",
            OpClass::PpSendBwd => "pp_send_bwd",
            OpClass::DpAllReduce => "dp_allreduce",
            OpClass::Optimizer => "optimizer",
            OpClass::TpComm => "tp_comm",
            OpClass::EpA2a => "ep_a2a",
        }
    }

    /// True for forward work (used for the per-micro-batch forward time).
    pub fn is_forward_compute(self) -> bool {
        matches!(
            self,
            OpClass::LinearFwd | OpClass::AttnFwd | OpClass::HeadFwd
        )
    }
}

/// Which stream of a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum StreamKind {
    /// Kernels.
    Compute,
    /// Context-parallel collectives.
    CpComm,
    /// Pipeline sends.
    PpComm,
    /// Data-parallel gradient reduction.
    DpComm,
    /// Tensor- and expert-parallel collectives (made only when TP or EP > 1).
    TpComm,
}

impl StreamKind {
    /// The name traces use.
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Compute => "compute",
            StreamKind::CpComm => "cp-comm",
            StreamKind::PpComm => "pp-comm",
            StreamKind::DpComm => "dp-comm",
            StreamKind::TpComm => "tp-comm",
        }
    }
}

/// A labelled op: what it is, for which micro-batch and layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpLabel {
    /// The class.
    pub class: OpClass,
    /// Micro-batch index inside the step (u16::MAX for step-level ops).
    pub mb: u16,
    /// Layer index (u16::MAX for ops that are not per layer).
    pub layer: u16,
}

/// What an op does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Occupies its stream for a fixed time.
    Compute(Ps),
    /// Moves one transfer (an index into the graph's transfers) through the network.
    Send(u32),
    /// One GPU's part of a collective.
    Coll(CollId),
}

/// One op, 16 bytes: its kind's tag, its class and its payload (a duration, a transfer or a
/// collective) share one word ([`Op::kind`] and [`Op::label`] rebuild them), and the next
/// op of its stream is found through the graph's per-stream order, so a step of hundreds of
/// millions of ops stays compact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// Bits 0..58: the payload; 58..62: the class; 62..64: the kind's tag.
    word: u64,
    /// Where it runs.
    pub stream: StreamId,
    /// The label's micro-batch.
    mb: u16,
    /// The label's layer.
    layer: u16,
}

const TAG_COMPUTE: u64 = 0;
const TAG_SEND: u64 = 1;
const TAG_COLL_OP: u64 = 2;
const PAYLOAD_BITS: u32 = 58;
/// The longest compute op an [`Op`] holds (2^58 ps, about 80 hours).
pub const MAX_OP_PS: Ps = (1 << PAYLOAD_BITS) - 1;
const CLASS_SHIFT: u32 = PAYLOAD_BITS;
const TAG_SHIFT: u32 = 62;

impl Op {
    /// The op; a compute duration above [`MAX_OP_PS`] is clamped to it here and rejected
    /// by [`GraphBuilder::build`].
    fn new(kind: OpKind, stream: StreamId, label: OpLabel) -> Op {
        let (tag, arg) = match kind {
            OpKind::Compute(d) => (TAG_COMPUTE, d.min(MAX_OP_PS)),
            OpKind::Send(x) => (TAG_SEND, u64::from(x)),
            OpKind::Coll(c) => (TAG_COLL_OP, u64::from(c)),
        };
        Op {
            word: tag << TAG_SHIFT | (label.class as u64) << CLASS_SHIFT | arg,
            stream,
            mb: label.mb,
            layer: label.layer,
        }
    }

    #[inline]
    fn tag(&self) -> u64 {
        self.word >> TAG_SHIFT
    }

    #[inline]
    fn arg(&self) -> u64 {
        self.word & MAX_OP_PS
    }

    /// The op with its payload replaced by `arg` (a translated id).
    fn with_arg(self, arg: u64) -> Op {
        Op {
            word: self.word & !MAX_OP_PS | arg,
            ..self
        }
    }

    /// What it does.
    #[inline]
    pub fn kind(&self) -> OpKind {
        match self.tag() {
            TAG_COMPUTE => OpKind::Compute(self.arg()),
            TAG_SEND => OpKind::Send(self.arg() as u32),
            _ => OpKind::Coll(self.arg() as u32),
        }
    }

    /// What it is.
    #[inline]
    pub fn label(&self) -> OpLabel {
        OpLabel {
            class: OpClass::ALL[((self.word >> CLASS_SHIFT) & 0xf) as usize],
            mb: self.mb,
            layer: self.layer,
        }
    }
}

/// A point-to-point transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Xfer {
    /// Sender.
    pub src: GpuId,
    /// Receiver.
    pub dst: GpuId,
    /// Bytes.
    pub bytes: u64,
}

/// A stream: which GPU, which kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// Its GPU.
    pub gpu: GpuId,
    /// Its kind.
    pub kind: StreamKind,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CollInfo {
    parts: u32,
    xfer_start: u32,
    xfer_len: u32,
    /// Grouped point-to-point: the range of its peer pairs in `Graph::p2p_pairs`.
    p2p: Option<(u32, u32)>,
    /// Time between the last transfer landing and the parts ending (the collective
    /// algorithm's latency).
    latency: Ps,
}

/// An op graph ready to run: ops in CSR form, per-stream issue order, collectives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    /// The ops, by id.
    pub ops: Vec<Op>,
    /// The streams, by id.
    pub streams: Vec<StreamInfo>,
    /// All transfers (of sends and of collectives; collectives with equal transfers share
    /// one list).
    pub xfers: Vec<Xfer>,
    ndeps: Vec<u32>,
    succ_off: Vec<u32>,
    succ: Vec<OpId>,
    stream_off: Vec<u32>,
    stream_ops: Vec<OpId>,
    colls: Vec<CollInfo>,
    coll_part_off: Vec<u32>,
    coll_parts: Vec<OpId>,
    /// Peer pairs (GPUs) of grouped point-to-point collectives.
    p2p_pairs: Vec<(GpuId, GpuId)>,
    /// Per collective part (index into `coll_parts`), CSR: its peers (part indices) and
    /// its own transfers (sender = its GPU). Empty for whole-group collectives.
    part_nbr_off: Vec<u32>,
    part_nbrs: Vec<u32>,
    part_xf_off: Vec<u32>,
    part_xf: Vec<u32>,
}

/// Builds a [`Graph`]. Ops must be added to each stream in issue order. Dependencies may
/// be added later with [`GraphBuilder::add_dep`] (a cycle is not rejected here: [`run`]
/// reports it as ops that never ran).
#[derive(Default)]
pub struct GraphBuilder {
    g: Graph,
    /// Dependencies (from, to) in chunks (an assembled graph keeps each part's own).
    edges: Vec<Vec<(OpId, OpId)>>,
    /// Per stream: its op count.
    count: Vec<u32>,
    /// The first compute op longer than [`MAX_OP_PS`], and its duration.
    too_long: Option<(OpId, Ps)>,
    /// Per hash of a non-empty transfer list: the first collective that added it.
    xfer_lists: std::collections::HashMap<u64, CollId>,
}

impl GraphBuilder {
    /// An empty builder with room for about `ops` ops.
    pub fn with_capacity(ops: usize) -> Self {
        let mut b = Self::default();
        b.g.ops.reserve(ops);
        b.g.ndeps.reserve(ops);
        b.edges = vec![Vec::with_capacity(ops + ops / 2)];
        b
    }

    /// A new stream on `gpu`.
    pub fn add_stream(&mut self, gpu: GpuId, kind: StreamKind) -> StreamId {
        self.g.streams.push(StreamInfo { gpu, kind });
        self.count.push(0);
        (self.g.streams.len() - 1) as StreamId
    }

    /// A new collective whose transfers are `xfers`; add its parts with
    /// [`GraphBuilder::add_op`] and `OpKind::Coll`.
    pub fn add_collective(&mut self, xfers: &[Xfer]) -> CollId {
        self.add_collective_with_latency(xfers, 0)
    }

    /// [`GraphBuilder::add_collective`] whose parts end `latency` after its last transfer
    /// lands (a collective algorithm's own latency, `net::collective::Lowered::latency`).
    /// A collective whose transfers equal an earlier one's (the same layer's exchange again,
    /// one layer on) shares that one's transfers instead of holding a copy.
    pub fn add_collective_with_latency(&mut self, xfers: &[Xfer], latency: Ps) -> CollId {
        self.add_coll(xfers, latency).0
    }

    /// [`GraphBuilder::add_collective_with_latency`], and the earlier collective whose
    /// transfers it shares, if any.
    fn add_coll(&mut self, xfers: &[Xfer], latency: Ps) -> (CollId, Option<CollId>) {
        let c = self.g.colls.len() as CollId;
        let like = self.shared_xfers(xfers, c);
        let start = match like {
            Some(r) => self.g.colls[r as usize].xfer_start,
            None => {
                self.g.xfers.extend_from_slice(xfers);
                (self.g.xfers.len() - xfers.len()) as u32
            }
        };
        self.g.colls.push(CollInfo {
            parts: 0,
            xfer_start: start,
            xfer_len: xfers.len() as u32,
            p2p: None,
            latency,
        });
        (c, like)
    }

    /// The earlier collective whose transfers equal `xfers` (none for an empty list), else
    /// `None` after noting that collective `c` adds them.
    fn shared_xfers(&mut self, xfers: &[Xfer], c: CollId) -> Option<CollId> {
        if xfers.is_empty() {
            return None;
        }
        let h = xfers.iter().fold(xfers.len() as u64, |h, x| {
            mix(mix(h, u64::from(x.src) | u64::from(x.dst) << 32), x.bytes)
        });
        match self.xfer_lists.entry(h) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let r = *e.get();
                let ci = self.g.colls[r as usize];
                let a = ci.xfer_start as usize;
                (self.g.xfers[a..a + ci.xfer_len as usize] == *xfers).then_some(r)
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(c);
                None
            }
        }
    }

    /// A new grouped point-to-point collective (an NCCL group of sends and receives):
    /// `xfers` are the priced transfers, each owned by the part on its sender's GPU;
    /// `pairs` are the GPU pairs that really exchange data (either direction). A part's
    /// transfers start once it and all its peers have arrived; it ends once its own and all
    /// its peers' transfers have landed. Add one part per GPU with [`GraphBuilder::add_op`]
    /// and `OpKind::Coll`; every sender and every pair's GPU needs a part. A collective
    /// that shares an earlier one's transfers shares its pairs too when they are equal.
    pub fn add_grouped_p2p(&mut self, xfers: &[Xfer], pairs: &[(GpuId, GpuId)]) -> CollId {
        let (c, like) = self.add_coll(xfers, 0);
        let g = &mut self.g;
        let shared = like
            .and_then(|r| g.colls[r as usize].p2p)
            .filter(|&(a, l)| l > 0 && g.p2p_pairs[a as usize..(a + l) as usize] == *pairs);
        let a = match shared {
            Some((a, _)) => a,
            None => {
                g.p2p_pairs.extend_from_slice(pairs);
                (g.p2p_pairs.len() - pairs.len()) as u32
            }
        };
        g.colls[c as usize].p2p = Some((a, pairs.len() as u32));
        c
    }

    /// A new transfer for a `Send` op.
    pub fn add_xfer(&mut self, x: Xfer) -> u32 {
        self.g.xfers.push(x);
        (self.g.xfers.len() - 1) as u32
    }

    /// Append an op to `stream` (after everything already on it) that also waits for `deps`.
    pub fn add_op(
        &mut self,
        stream: StreamId,
        kind: OpKind,
        label: OpLabel,
        deps: &[OpId],
    ) -> OpId {
        let id = self.g.ops.len() as OpId;
        self.g.ops.push(Op::new(kind, stream, label));
        self.g.ndeps.push(deps.len() as u32);
        // Count it on its stream (an unknown stream is rejected by `build`).
        if let Some(n) = self.count.get_mut(stream as usize) {
            *n += 1;
        }
        self.edge_chunk().extend(deps.iter().map(|&d| (d, id)));
        match kind {
            OpKind::Coll(c) => {
                if let Some(ci) = self.g.colls.get_mut(c as usize) {
                    ci.parts += 1;
                }
            }
            OpKind::Compute(d) if d > MAX_OP_PS && self.too_long.is_none() => {
                self.too_long = Some((id, d));
            }
            _ => {}
        }
        id
    }

    /// Make `op` also wait for `dep` (both already added).
    pub fn add_dep(&mut self, dep: OpId, op: OpId) {
        if let Some(n) = self.g.ndeps.get_mut(op as usize) {
            *n += 1;
        }
        self.edge_chunk().push((dep, op));
    }

    /// The chunk new dependencies go to.
    fn edge_chunk(&mut self) -> &mut Vec<(OpId, OpId)> {
        if self.edges.is_empty() {
            self.edges.push(Vec::new());
        }
        let last = self.edges.len() - 1;
        &mut self.edges[last]
    }

    /// Ops added so far.
    pub fn len(&self) -> usize {
        self.g.ops.len()
    }

    /// True when no op was added.
    pub fn is_empty(&self) -> bool {
        self.g.ops.is_empty()
    }

    /// Finish: check the references and lay out the CSR arrays.
    pub fn build(mut self) -> Result<Graph> {
        let g = &mut self.g;
        let n = g.ops.len();
        if n >= OpId::MAX as usize || g.colls.len() >= COLL_BIT as usize {
            return Err(invalid(
                "op graph size",
                format!("{n} ops, {} collectives", g.colls.len()),
                "fewer than 2^32 - 1 ops and 2^31 collectives",
            ));
        }
        if let Some((op, d)) = self.too_long {
            return Err(invalid(
                format!("op {op} duration"),
                format!("{d} ps"),
                format!("at most {MAX_OP_PS} ps (about 80 hours)"),
            ));
        }
        let ns = g.streams.len();
        let nc = g.colls.len();
        let nx = g.xfers.len();
        let bad_op = first_in_chunks(&g.ops, |op| {
            op.stream as usize >= ns
                || match op.kind() {
                    OpKind::Coll(c) => c as usize >= nc,
                    OpKind::Send(x) => x as usize >= nx,
                    OpKind::Compute(_) => false,
                }
        });
        if let Some((i, op)) = bad_op {
            let (field, value, allowed) = match op.kind() {
                OpKind::Coll(c) if (op.stream as usize) < ns => {
                    ("op collective", c, format!("< {nc} collectives (op {i})"))
                }
                OpKind::Send(x) if (op.stream as usize) < ns => {
                    ("op transfer", x, format!("< {nx} transfers (op {i})"))
                }
                _ => ("op stream", op.stream, format!("< {ns} streams (op {i})")),
            };
            return Err(invalid(field, value, allowed));
        }
        if let Some((_, &(d, s))) = self.edges.par_iter().find_map_first(|c| {
            first_in_chunks(c, |&(d, s)| d as usize >= n || s as usize >= n || d == s)
        }) {
            return Err(invalid(
                "dependency",
                format!("{d} -> {s}"),
                format!("two distinct ops < {n}"),
            ));
        }
        // Three CSR layouts, each a stable counting sort, built side by side: successors
        // by source; each stream's ops in issue order (`add_op` counted and linked them);
        // each collective's parts in op order.
        let edges = std::mem::take(&mut self.edges);
        let (ops, colls, count) = (&g.ops, &g.colls, &self.count);
        let ((succ, streams), parts) = rayon::join(
            || {
                rayon::join(
                    || {
                        let mut off = vec![0; n + 1];
                        for &(d, _) in edges.iter().flatten() {
                            off[d as usize + 1] += 1;
                        }
                        counting_csr(off, edges.iter().flatten().copied())
                    },
                    || {
                        let mut off = vec![0; ns + 1];
                        off[1..].copy_from_slice(count);
                        let items = ops.iter().enumerate().map(|(i, op)| (op.stream, i as OpId));
                        counting_csr(off, items)
                    },
                )
            },
            || {
                let mut off = vec![0; nc + 1];
                for (i, c) in colls.iter().enumerate() {
                    off[i + 1] = c.parts;
                }
                let items = ops
                    .iter()
                    .enumerate()
                    .filter_map(|(i, op)| match op.kind() {
                        OpKind::Coll(c) => Some((c, i as OpId)),
                        _ => None,
                    });
                counting_csr(off, items)
            },
        );
        drop(edges);
        (g.succ_off, g.succ) = succ;
        (g.stream_off, g.stream_ops) = streams;
        (g.coll_part_off, g.coll_parts) = parts;
        g.p2p_layout()?;
        Ok(self.g)
    }
}

/// The first item of `items` (with its index) for which `bad` holds: chunks scanned in
/// parallel, each by a plain loop (a part's graph is small, a whole step's has hundreds of
/// millions of items).
fn first_in_chunks<T: Sync>(items: &[T], bad: impl Fn(&T) -> bool + Sync) -> Option<(usize, &T)> {
    const CHUNK: usize = 1 << 16;
    if items.len() <= CHUNK {
        return items.iter().enumerate().find(|(_, x)| bad(x));
    }
    items
        .par_chunks(CHUNK)
        .enumerate()
        .find_map_first(|(k, c)| {
            let i = c.iter().position(&bad)?;
            Some((k * CHUNK + i, &c[i]))
        })
}

/// One step of the fingerprints that find equal lists: `x` mixed into `h`.
fn mix(h: u64, x: u64) -> u64 {
    (h.rotate_left(5) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A CSR layout by a stable counting sort: `off[k + 1]` holds how many of `items` (key,
/// value) have key k; returns the offsets and the values grouped by key, each group in
/// `items`' order.
fn counting_csr(
    mut off: Vec<u32>,
    items: impl Iterator<Item = (u32, u32)>,
) -> (Vec<u32>, Vec<u32>) {
    for i in 1..off.len() {
        off[i] += off[i - 1];
    }
    let mut fill = off.clone();
    let mut vals = vec![0; off.last().copied().unwrap_or(0) as usize];
    for (k, v) in items {
        vals[fill[k as usize] as usize] = v;
        fill[k as usize] += 1;
    }
    (off, vals)
}

/// How [`Graph::p2p_layout`] laid out one collective.
enum Laid {
    /// A whole-group collective: no per-part layout.
    Whole,
    /// A grouped send/recv with its own layout.
    Own(P2pParts),
    /// A grouped send/recv laid out as the earlier one with this index.
    As(usize),
}

/// One grouped send/recv's per-part peers (local part indices) and transfers, offsets
/// local to its parts.
struct P2pParts {
    nbr_off: Vec<u32>,
    nbrs: Vec<u32>,
    xf_off: Vec<u32>,
    xf: Vec<u32>,
}

impl Graph {
    /// GPUs the streams name: one past the highest GPU id (0 for no streams).
    pub fn gpu_count(&self) -> usize {
        self.streams
            .iter()
            .map(|s| s.gpu as usize + 1)
            .max()
            .unwrap_or(0)
    }

    /// Per part of every grouped point-to-point collective: its peers and its own
    /// transfers (CSR over part indices; empty for whole-group collectives). Collectives
    /// are laid out in parallel and concatenated in order; the first one in order that
    /// fails names the error. A collective equal to an earlier one in pairs, transfers and
    /// its parts' GPUs (the same exchange, one layer on) takes that one's layout.
    fn p2p_layout(&mut self) -> Result<()> {
        if self.colls.iter().all(|c| c.p2p.is_none()) {
            // No grouped send/recv: no per-part arrays (a step of Ulysses' all-to-alls has
            // millions of parts).
            return Ok(());
        }
        let gpus = self.gpu_count();
        let this = &*self;
        let keys: Vec<Option<u64>> = (0..this.colls.len())
            .into_par_iter()
            .map(|ci| this.p2p_key(ci))
            .collect();
        let mut first = std::collections::HashMap::new();
        let like: Vec<usize> = keys
            .iter()
            .enumerate()
            .map(|(ci, k)| k.map_or(ci, |h| *first.entry(h).or_insert(ci)))
            .collect();
        drop(first);
        let laid: Vec<Result<Laid>> = (0..this.colls.len())
            .into_par_iter()
            .map_init(
                || vec![(u32::MAX, 0u32); gpus],
                |at, ci| {
                    let r = like[ci];
                    if r != ci && this.same_p2p(r, ci) {
                        return Ok(Laid::As(r));
                    }
                    Ok(match this.p2p_parts(ci, at)? {
                        Some(l) => Laid::Own(l),
                        None => Laid::Whole,
                    })
                },
            )
            .collect();
        let laid: Vec<Laid> = laid.into_iter().collect::<Result<_>>()?;
        let own = |ci: usize| match &laid[ci] {
            Laid::As(r) => &laid[*r],
            l => l,
        };
        // Sized once, not grown by doubling (a step has millions of parts).
        let (nn, nx) = (0..laid.len()).fold((0, 0), |(nn, nx), ci| match own(ci) {
            Laid::Own(l) => (nn + l.nbrs.len(), nx + l.xf.len()),
            _ => (nn, nx),
        });
        let np = self.coll_parts.len();
        let mut nbr_off = Vec::with_capacity(np + 1);
        let mut xf_off = Vec::with_capacity(np + 1);
        nbr_off.push(0);
        xf_off.push(0);
        let (mut nbrs, mut xf) = (Vec::with_capacity(nn), Vec::with_capacity(nx));
        for ci in 0..laid.len() {
            let (a, b) = (self.coll_part_off[ci], self.coll_part_off[ci + 1]);
            let parts = (b - a) as usize;
            match own(ci) {
                Laid::Own(l) => {
                    for k in 0..parts {
                        nbr_off.push(nbrs.len() as u32 + l.nbr_off[k + 1]);
                        xf_off.push(xf.len() as u32 + l.xf_off[k + 1]);
                    }
                    nbrs.extend(l.nbrs.iter().map(|&q| a + q));
                    xf.extend_from_slice(&l.xf);
                }
                _ => {
                    nbr_off.extend(std::iter::repeat_n(nbrs.len() as u32, parts));
                    xf_off.extend(std::iter::repeat_n(xf.len() as u32, parts));
                }
            }
        }
        self.part_nbr_off = nbr_off;
        self.part_xf_off = xf_off;
        self.part_nbrs = nbrs;
        self.part_xf = xf;
        Ok(())
    }

    /// The GPU of part `k` (an index into `coll_parts`).
    fn part_gpu(&self, k: usize) -> GpuId {
        self.streams[self.ops[self.coll_parts[k] as usize].stream as usize].gpu
    }

    /// A hash of grouped send/recv `ci`'s transfers, pairs and parts' GPUs (`None` for a
    /// whole-group collective): collectives that [`Graph::same_p2p`] have equal keys.
    fn p2p_key(&self, ci: usize) -> Option<u64> {
        let c = &self.colls[ci];
        let (pa, pl) = c.p2p?;
        let mut h = mix(u64::from(c.xfer_start), u64::from(c.xfer_len));
        for &(s, d) in &self.p2p_pairs[pa as usize..(pa + pl) as usize] {
            h = mix(h, u64::from(s) | u64::from(d) << 32);
        }
        h = mix(h, u64::from(c.parts));
        for k in self.coll_part_off[ci]..self.coll_part_off[ci + 1] {
            h = mix(h, u64::from(self.part_gpu(k as usize)));
        }
        Some(h)
    }

    /// Grouped send/recvs `r` and `ci` have the same transfers, pairs and parts' GPUs in
    /// order, so the same layout local to their parts.
    fn same_p2p(&self, r: usize, ci: usize) -> bool {
        let (x, y) = (&self.colls[r], &self.colls[ci]);
        let pairs = |c: &CollInfo| {
            c.p2p
                .map(|(a, l)| &self.p2p_pairs[a as usize..(a + l) as usize])
        };
        let gpus = |c: usize| {
            (self.coll_part_off[c]..self.coll_part_off[c + 1]).map(|k| self.part_gpu(k as usize))
        };
        x.xfer_start == y.xfer_start
            && x.xfer_len == y.xfer_len
            && x.parts == y.parts
            && pairs(x).is_some()
            && pairs(x) == pairs(y)
            && gpus(r).eq(gpus(ci))
    }

    /// Collective `ci`'s parts' peers (local part indices, ascending, once each) and own
    /// transfers (in transfer order), offsets local to its parts; `None` for a
    /// whole-group collective. `at` maps a GPU to (collective, part) and may hold any
    /// other collective's entries.
    fn p2p_parts(&self, ci: usize, at: &mut [(u32, u32)]) -> Result<Option<P2pParts>> {
        let info = &self.colls[ci];
        let Some((pa, pl)) = info.p2p else {
            return Ok(None);
        };
        let (a, b) = (
            self.coll_part_off[ci] as usize,
            self.coll_part_off[ci + 1] as usize,
        );
        // GPU → part index, one part per GPU.
        let tag = ci as u32;
        for k in a..b {
            let gpu = self.streams[self.ops[self.coll_parts[k] as usize].stream as usize].gpu;
            let e = &mut at[gpu as usize];
            if e.0 == tag {
                return Err(invalid(
                    format!("grouped send/recv {ci} parts"),
                    format!("two parts on GPU {gpu}"),
                    "one part per GPU",
                ));
            }
            *e = (tag, k as u32);
        }
        let part = |gpu: GpuId| match at.get(gpu as usize) {
            Some(&(t, k)) if t == tag => Ok(k),
            _ => Err(invalid(
                format!("grouped send/recv {ci}"),
                format!("GPU {gpu}"),
                "a GPU with a part in the collective",
            )),
        };
        let pairs = &self.p2p_pairs[pa as usize..(pa + pl) as usize];
        let mut e: Vec<(u32, u32)> = Vec::with_capacity(2 * pairs.len());
        for &(s, d) in pairs {
            let (ps, pd) = (part(s)?, part(d)?);
            if ps != pd {
                let (ps, pd) = (ps - a as u32, pd - a as u32);
                e.push((ps, pd));
                e.push((pd, ps));
            }
        }
        e.sort_unstable();
        e.dedup();
        let mut x: Vec<(u32, u32)> = Vec::with_capacity(info.xfer_len as usize);
        for i in info.xfer_start..info.xfer_start + info.xfer_len {
            x.push((part(self.xfers[i as usize].src)? - a as u32, i));
        }
        // Transfer ids ascend, so a stable sort by part keeps each part's in order.
        x.sort_by_key(|&(k, _)| k);
        let csr = |v: &[(u32, u32)]| {
            let mut off = vec![0u32; b - a + 1];
            for &(k, _) in v {
                off[k as usize + 1] += 1;
            }
            for k in 1..off.len() {
                off[k] += off[k - 1];
            }
            (off, v.iter().map(|&(_, q)| q).collect::<Vec<u32>>())
        };
        let ((nbr_off, nbrs), (xf_off, xf)) = (csr(&e), csr(&x));
        Ok(Some(P2pParts {
            nbr_off,
            nbrs,
            xf_off,
            xf,
        }))
    }

    fn part_nbrs(&self, k: u32) -> &[u32] {
        if self.part_nbr_off.is_empty() {
            return &[];
        }
        &self.part_nbrs
            [self.part_nbr_off[k as usize] as usize..self.part_nbr_off[k as usize + 1] as usize]
    }

    fn part_xfers(&self, k: u32) -> &[u32] {
        if self.part_xf_off.is_empty() {
            return &[];
        }
        &self.part_xf
            [self.part_xf_off[k as usize] as usize..self.part_xf_off[k as usize + 1] as usize]
    }

    /// Collective parts with per-part state (all of them when any collective is a grouped
    /// send/recv, else none).
    fn part_count(&self) -> usize {
        self.part_nbr_off.len().saturating_sub(1)
    }

    /// The part index (into `coll_parts`) of op `op`, a part of collective `c`.
    fn part_of(&self, c: CollId, op: OpId) -> u32 {
        let a = self.coll_part_off[c as usize] as usize;
        let b = self.coll_part_off[c as usize + 1] as usize;
        // Parts are filled in op order, so each collective's range is sorted.
        let i = self.coll_parts[a..b].partition_point(|&o| o < op);
        (a + i) as u32
    }

    /// When op `op`'s own work began in `t`: for a collective part, when its transfers
    /// started (a whole-group collective: its last arrival; a grouped send/recv part: the
    /// last arrival among it and its peers), so the time from `t.start` to this is the
    /// GPU's synchronisation wait; for any other op, its start.
    pub fn xfer_start(&self, t: &Timeline, op: OpId) -> Ps {
        match self.ops[op as usize].kind() {
            OpKind::Coll(c) if self.colls[c as usize].p2p.is_some() => {
                let k = self.part_of(c, op);
                std::iter::once(k)
                    .chain(self.part_nbrs(k).iter().copied())
                    .map(|q| t.start[self.coll_parts[q as usize] as usize])
                    .max()
                    .unwrap_or(t.start[op as usize])
            }
            OpKind::Coll(c) => t.coll_start[c as usize],
            _ => t.start[op as usize],
        }
    }

    /// [`Graph::xfer_start`] of every op in `t`, by op id, when the graph has grouped
    /// send/recv parts (one lookup each would visit its peers' ops all over the timeline;
    /// here each collective's parts are taken together); `None` when it has none (each
    /// lookup is then one read).
    pub fn xfer_starts(&self, t: &Timeline) -> Option<Vec<Ps>> {
        if self.part_count() == 0 {
            return None;
        }
        // Per part: the latest arrival among it and its peers.
        let go: Vec<Ps> = (0..self.part_count() as u32)
            .into_par_iter()
            .map(|k| {
                std::iter::once(k)
                    .chain(self.part_nbrs(k).iter().copied())
                    .map(|q| t.start[self.coll_parts[q as usize] as usize])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut v: Vec<Ps> = self
            .ops
            .par_iter()
            .zip(&t.start)
            .map(|(op, &st)| match op.kind() {
                OpKind::Coll(c) => t.coll_start[c as usize],
                _ => st,
            })
            .collect();
        for (ci, info) in self.colls.iter().enumerate() {
            if info.p2p.is_some() {
                let (a, b) = (self.coll_part_off[ci], self.coll_part_off[ci + 1]);
                for k in a..b {
                    v[self.coll_parts[k as usize] as usize] = go[k as usize];
                }
            }
        }
        Some(v)
    }

    /// True when `op` is the first op of `stream` (its own stream).
    fn stream_first(&self, stream: StreamId, op: OpId) -> bool {
        self.stream_ops[self.stream_off[stream as usize] as usize] == op
    }

    /// The ops of `stream` in issue order.
    pub fn stream_ops(&self, stream: StreamId) -> &[OpId] {
        let s = stream as usize;
        match (self.stream_off.get(s), self.stream_off.get(s + 1)) {
            (Some(&a), Some(&b)) => &self.stream_ops[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Number of collectives.
    pub fn collectives(&self) -> usize {
        self.colls.len()
    }

    /// The transfers of collective `c`.
    pub fn coll_xfers(&self, c: CollId) -> &[Xfer] {
        let ci = self.colls[c as usize];
        &self.xfers[ci.xfer_start as usize..(ci.xfer_start + ci.xfer_len) as usize]
    }

    /// Bytes of approximate memory the graph holds (for the benchmark's budget).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.ops.capacity() * size_of::<Op>()
            + self.xfers.capacity() * size_of::<Xfer>()
            + (self.ndeps.capacity()
                + self.succ_off.capacity()
                + self.succ.capacity()
                + self.stream_off.capacity()
                + self.stream_ops.capacity()
                + self.coll_part_off.capacity()
                + self.coll_parts.capacity()
                + self.part_nbr_off.capacity()
                + self.part_nbrs.capacity()
                + self.part_xf_off.capacity()
                + self.part_xf.capacity())
                * 4
            + self.p2p_pairs.capacity() * 8
            + self.colls.capacity() * size_of::<CollInfo>()
    }
}

/// What [`run`] recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeline {
    /// Start of each op (for a collective part: when this GPU arrived).
    pub start: Vec<Ps>,
    /// End of each op.
    pub end: Vec<Ps>,
    /// When each collective's last part arrived and its transfers began (grouped
    /// point-to-point: when its first part's transfers began).
    pub coll_start: Vec<Ps>,
    /// The end of the last op.
    pub makespan: Ps,
    /// Events processed (op completions from the queue plus network completions).
    pub events: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    time: Ps,
    seq: u64,
    /// Op id, or collective id with `COLL_BIT`, or grouped point-to-point part with
    /// `PART_BIT`.
    id: u64,
}

const COLL_BIT: u32 = 1 << 31;
const EV_COLL: u64 = 1 << 63;
const EV_PART: u64 = 1 << 62;

#[derive(Clone, Copy)]
struct StreamState {
    /// The next op to run, as an index into `Graph::stream_ops` (the stream's end when
    /// it is done).
    pos: u32,
    end: u32,
    busy: bool,
}

impl StreamState {
    /// The next op to run, if any.
    fn head(&self, g: &Graph) -> Option<OpId> {
        (self.pos < self.end).then(|| g.stream_ops[self.pos as usize])
    }
}
const TAG_COLL: u64 = 1 << 63;
const TAG_PART: u64 = 1 << 62;

/// Per-op and per-collective state of one run. The workers of a split run
/// ([`split`]) share it, each writing only the entries of its own streams' ops and
/// collectives (and the coupling ops' readiness, by read-modify-write), so every entry is
/// a relaxed atomic: a plain load or store on the one-worker path.
struct Shared {
    deps_left: Vec<AtomicU32>,
    start: Vec<AtomicU64>,
    end: Vec<AtomicU64>,
    coll_start: Vec<AtomicU64>,
    arrived: Vec<AtomicU32>,
    pending: Vec<AtomicU32>,
}

impl Shared {
    fn new(g: &Graph) -> Shared {
        let (n, nc) = (g.ops.len(), g.colls.len());
        let z64 = |k| (0..k).map(|_| AtomicU64::new(0)).collect();
        let z32 = |k| (0..k).map(|_| AtomicU32::new(0)).collect();
        Shared {
            deps_left: g.ndeps.par_iter().map(|&d| AtomicU32::new(d)).collect(),
            start: z64(n),
            end: z64(n),
            coll_start: z64(nc),
            arrived: z32(nc),
            pending: z32(nc),
        }
    }

    fn timeline(self, events: u64) -> Timeline {
        let v =
            |a: Vec<AtomicU64>| -> Vec<Ps> { a.into_iter().map(AtomicU64::into_inner).collect() };
        let end = v(self.end);
        Timeline {
            start: v(self.start),
            makespan: end.iter().copied().max().unwrap_or(0),
            end,
            coll_start: v(self.coll_start),
            events,
        }
    }
}

/// Which streams a split run's worker runs, and when it stops ([`split`]).
struct Worker<'g> {
    /// Per stream: the worker that runs it (`u32::MAX`: a coupling stream, run after the
    /// workers have been joined).
    owner: &'g [u32],
    me: u32,
    /// Per collective: its index among the coupling collectives that may start first, or
    /// `u32::MAX`.
    cand: &'g [u32],
    /// Per such collective: this worker's ops its parts still wait for, and when the last
    /// of them ended.
    need: Vec<u32>,
    met: Vec<Ps>,
    /// Whether meeting a collective's needs lowers the horizon to that time.
    lower: bool,
}

struct Sim<'g, N: NetworkModel + ?Sized> {
    g: &'g Graph,
    net: &'g mut N,
    sh: &'g Shared,
    heap: BinaryHeap<Reverse<Event>>,
    seq: u64,
    now: Ps,
    /// Per stream: next op index into `stream_ops`, end index, busy flag.
    st: Vec<StreamState>,
    /// Per grouped point-to-point part: arrivals (itself and peers) still awaited before
    /// its transfers start, its transfers in flight, drained parts (itself and peers)
    /// still awaited before it ends.
    part_start_wait: Vec<u32>,
    part_pending: Vec<u32>,
    part_end_wait: Vec<u32>,
    events: u64,
    /// Events after this time wait.
    horizon: Ps,
    worker: Option<Worker<'g>>,
}

impl<'g, N: NetworkModel + ?Sized> Sim<'g, N> {
    fn new(g: &'g Graph, net: &'g mut N, sh: &'g Shared, worker: Option<Worker<'g>>) -> Self {
        let ns = g.streams.len();
        let waits = || -> Vec<u32> {
            (0..g.part_count() as u32)
                .map(|k| 1 + g.part_nbrs(k).len() as u32)
                .collect()
        };
        Sim {
            g,
            net,
            sh,
            heap: BinaryHeap::with_capacity(ns),
            seq: 0,
            now: 0,
            st: (0..ns)
                .map(|s| StreamState {
                    pos: g.stream_off[s],
                    end: g.stream_off[s + 1],
                    busy: false,
                })
                .collect(),
            part_start_wait: waits(),
            part_pending: vec![0; g.part_count()],
            part_end_wait: waits(),
            events: 0,
            horizon: Ps::MAX,
            worker,
        }
    }

    /// True when this run runs stream `s`.
    fn owns(&self, s: StreamId) -> bool {
        self.worker
            .as_ref()
            .is_none_or(|w| w.owner[s as usize] == w.me)
    }

    fn push(&mut self, time: Ps, id: u64) {
        self.seq += 1;
        self.heap.push(Reverse(Event {
            time,
            seq: self.seq,
            id,
        }));
    }

    fn try_start(&mut self, s: StreamId) {
        let ss = self.st[s as usize];
        if ss.busy {
            return;
        }
        let Some(op) = ss.head(self.g) else {
            return;
        };
        if self.sh.deps_left[op as usize].load(Relaxed) != 0 {
            return;
        }
        self.st[s as usize].busy = true;
        self.sh.start[op as usize].store(self.now, Relaxed);
        match self.g.ops[op as usize].kind() {
            OpKind::Compute(d) => self.push(self.now + d, u64::from(op)),
            OpKind::Send(x) => {
                let x = self.g.xfers[x as usize];
                self.net
                    .start(self.now, x.src, x.dst, x.bytes, u64::from(op));
            }
            OpKind::Coll(c) if self.g.colls[c as usize].p2p.is_some() => {
                let g = self.g;
                let k = g.part_of(c, op);
                for q in std::iter::once(k).chain(g.part_nbrs(k).iter().copied()) {
                    let w = &mut self.part_start_wait[q as usize];
                    *w -= 1;
                    if *w == 0 {
                        self.start_part(c, q);
                    }
                }
            }
            OpKind::Coll(c) => {
                let ci = c as usize;
                let arrived = self.sh.arrived[ci].load(Relaxed) + 1;
                self.sh.arrived[ci].store(arrived, Relaxed);
                let info = self.g.colls[ci];
                if arrived == info.parts {
                    self.sh.coll_start[ci].store(self.now, Relaxed);
                    self.sh.pending[ci].store(info.xfer_len, Relaxed);
                    if info.xfer_len == 0 {
                        self.push(self.now + info.latency, EV_COLL | u64::from(c));
                    }
                    for x in &self.g.xfers
                        [info.xfer_start as usize..(info.xfer_start + info.xfer_len) as usize]
                    {
                        self.net
                            .start(self.now, x.src, x.dst, x.bytes, TAG_COLL | u64::from(c));
                    }
                }
            }
        }
    }

    fn complete(&mut self, op: OpId) {
        let oi = op as usize;
        self.sh.end[oi].store(self.now, Relaxed);
        let o = self.g.ops[oi];
        let s = o.stream;
        let ss = &mut self.st[s as usize];
        ss.busy = false;
        ss.pos += 1;
        let (a, b) = (
            self.g.succ_off[oi] as usize,
            self.g.succ_off[oi + 1] as usize,
        );
        for k in a..b {
            let succ = self.g.succ[k];
            let ss = self.g.ops[succ as usize].stream;
            let d = &self.sh.deps_left[succ as usize];
            if self.owns(ss) {
                let left = d.load(Relaxed) - 1;
                d.store(left, Relaxed);
                if left == 0 {
                    self.try_start(ss);
                }
            } else {
                // A coupling op: it starts after the join, at its latest dependency's end.
                d.fetch_sub(1, Relaxed);
                self.sh.start[succ as usize].fetch_max(self.now, Relaxed);
                self.coupled(succ);
            }
        }
        self.try_start(s);
    }

    /// One of this worker's ops that coupling op `op` waits for has ended now.
    fn coupled(&mut self, op: OpId) {
        let (g, now) = (self.g, self.now);
        let (Some(w), OpKind::Coll(c)) = (self.worker.as_mut(), g.ops[op as usize].kind()) else {
            return;
        };
        let Some(k) = w.cand.get(c as usize).filter(|&&k| k != u32::MAX) else {
            return;
        };
        let k = *k as usize;
        w.need[k] -= 1;
        if w.need[k] == 0 {
            w.met[k] = now;
            if w.lower {
                self.horizon = self.horizon.min(now);
            }
        }
    }

    /// Part `k` of grouped point-to-point collective `c` and its peers have all arrived:
    /// its transfers start (none: it is drained at once, through the queue).
    fn start_part(&mut self, c: CollId, k: u32) {
        let g = self.g;
        let arrived = &self.sh.arrived[c as usize];
        if arrived.load(Relaxed) == 0 {
            self.sh.coll_start[c as usize].store(self.now, Relaxed);
        }
        arrived.store(arrived.load(Relaxed) + 1, Relaxed);
        let xf = g.part_xfers(k);
        self.part_pending[k as usize] = xf.len() as u32;
        if xf.is_empty() {
            self.push(self.now, EV_PART | u64::from(k));
        }
        for &x in xf {
            let x = g.xfers[x as usize];
            self.net
                .start(self.now, x.src, x.dst, x.bytes, TAG_PART | u64::from(k));
        }
    }

    /// Part `k`'s transfers have all landed: it and each peer whose every neighbour has
    /// drained end now.
    fn drain_part(&mut self, k: u32) {
        let g = self.g;
        for q in std::iter::once(k).chain(g.part_nbrs(k).iter().copied()) {
            let w = &mut self.part_end_wait[q as usize];
            *w -= 1;
            if *w == 0 {
                self.complete(g.coll_parts[q as usize]);
            }
        }
    }

    fn complete_coll(&mut self, c: CollId) {
        let ci = c as usize;
        let (a, b) = (
            self.g.coll_part_off[ci] as usize,
            self.g.coll_part_off[ci + 1] as usize,
        );
        for k in a..b {
            let op = self.g.coll_parts[k];
            self.complete(op);
        }
    }

    /// Start every stream this run runs that can start.
    fn start_streams(&mut self) {
        for s in 0..self.g.streams.len() as StreamId {
            if self.owns(s) {
                self.try_start(s);
            }
        }
    }

    /// Process events in (time, sequence) order, network completions first at equal
    /// times, while the next one is at or before the horizon.
    fn run_loop(&mut self) {
        let g = self.g;
        let mut done: Vec<u64> = Vec::with_capacity(64);
        loop {
            let th = self.heap.peek().map(|e| e.0.time);
            let tn = self.net.next_completion();
            let (net_first, t) = match (th, tn) {
                (None, None) => break,
                (Some(a), None) => (false, a),
                (None, Some(b)) => (true, b),
                (Some(a), Some(b)) => (b <= a, a.min(b)),
            };
            if t > self.horizon {
                break;
            }
            if net_first {
                self.now = self.now.max(t);
                self.net.advance(self.now, &mut done);
                for &tag in &done {
                    self.events += 1;
                    if tag & TAG_COLL != 0 {
                        let c = (tag & !TAG_COLL) as usize;
                        let p = self.sh.pending[c].load(Relaxed) - 1;
                        self.sh.pending[c].store(p, Relaxed);
                        if p == 0 {
                            match g.colls[c].latency {
                                0 => self.complete_coll(c as CollId),
                                l => self.push(self.now + l, EV_COLL | c as u64),
                            }
                        }
                    } else if tag & TAG_PART != 0 {
                        let k = (tag & !TAG_PART) as u32;
                        self.part_pending[k as usize] -= 1;
                        if self.part_pending[k as usize] == 0 {
                            self.drain_part(k);
                        }
                    } else {
                        self.complete(tag as OpId);
                    }
                }
                done.clear();
            } else if let Some(Reverse(e)) = self.heap.pop() {
                self.now = e.time;
                self.events += 1;
                if e.id & EV_COLL != 0 {
                    self.complete_coll((e.id & !EV_COLL) as CollId);
                } else if e.id & EV_PART != 0 {
                    self.drain_part((e.id & !EV_PART) as u32);
                } else {
                    self.complete(e.id as OpId);
                }
            }
        }
    }

    /// The error for the first stream (by id) with an op that never ran, if any.
    fn stuck(&self) -> Result<()> {
        for (s, ss) in self.st.iter().enumerate() {
            if let Some(op) = ss.head(self.g) {
                return Err(stuck_error(self.g, s as StreamId, op));
            }
        }
        Ok(())
    }
}

/// Run `g` on `net` from time 0 and record every op's start and end: by one sweep of the
/// DAG ([`dag::run_dag`]) when the model fixes every transfer's duration by the transfer
/// alone ([`NetworkModel::fixed_durations`]), else by the event engine ([`run_events`];
/// under the flow model on link-disjoint parts apart and then joined when the graph
/// splits, `split`). All give the same timeline.
///
/// Errors when the graph cannot finish (a stream's head waits on an op that never runs,
/// or a collective whose parts are not all issued): the message names the stuck op.
pub fn run(g: &Graph, net: &mut dyn NetworkModel) -> Result<Timeline> {
    let Some(d) = net.fixed_durations() else {
        #[cfg(test)]
        let twin = net.as_flow().map(|f| f.idle_copy());
        if let Some(t) = net.as_flow().and_then(|f| split::run_split(g, f)) {
            // In the crate's own tests every graph run in parts is also a differential
            // test against the whole graph's run.
            #[cfg(test)]
            if let Some(mut w) = twin {
                let whole = run_events(g, &mut w);
                match (&t, &whole) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "the split run and the whole run disagree"),
                    (a, b) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
                }
            }
            return t;
        }
        return run_events(g, net);
    };
    let t = dag::run_dag(g, d);
    // In the crate's own tests every step simulated through here is also a differential
    // test of the DAG sweep against the event engine.
    #[cfg(test)]
    assert_eq!(
        t,
        run_events(g, net),
        "the DAG sweep and the event engine disagree"
    );
    t
}

/// The error for a graph that cannot finish: stream `s`'s op `op` never ran.
fn stuck_error(g: &Graph, s: StreamId, op: OpId) -> crate::error::Error {
    let l = g.ops[op as usize].label();
    let si = s as usize;
    crate::error::Error::Deadlock {
        op,
        class: l.class.name(),
        mb: l.mb,
        layer: l.layer,
        gpu: g.streams[si].gpu,
        stream: g.streams[si].kind.name(),
    }
}

/// The event engine: run `g` on `net` by processing events in (time, sequence) order. The
/// reference for [`dag::run_dag`]; [`run`] picks it for models whose transfers share
/// bandwidth.
pub fn run_events(g: &Graph, net: &mut dyn NetworkModel) -> Result<Timeline> {
    let sh = Shared::new(g);
    let mut sim = Sim::new(g, net, &sh, None);
    sim.start_streams();
    sim.run_loop();
    sim.stuck()?;
    let events = sim.events;
    Ok(sh.timeline(events))
}

#[cfg(test)]
mod tests;
