//! WLB-LLM (Wang et al., "WLB-LLM: Workload-Balanced 4D Parallelism for Large Language
//! Model Training", OSDI 2025): the planning half.
//!
//! Owns three pure algorithms over the samples of a global batch, each with its own typed
//! output, and their lowering to a `Plan` ([`lower`]):
//!
//! 1. **Variable-length packing** across the micro-batches of a step (paper: workload-aware
//!    variable-length document packing): the step's samples, longest first, each go to the
//!    micro-batch with the least estimated latency W(m) = Σ W_a(d) + W_l(d) as long as it
//!    stays under the memory cap `S_max` tokens; otherwise to the micro-batch with the fewest
//!    tokens, if it fits there; otherwise the sample is carried to the next step
//!    ([`WlbPacker`], [`var_len_pack`]).
//! 2. **Outlier delay** (paper: outlier document delay; optional, off by default because it
//!    changes which samples each step trains on): `n` FIFO queues with thresholds
//!    `L_1 < … < L_{n+1}`; a sample with `L_i ≤ len < L_{i+1}` (the last queue also takes
//!    `len = L_{n+1}`) waits in queue `i` until the queue holds as many samples as the step
//!    has micro-batches; then that many leave it together, oldest first, into the step being
//!    packed. The delay is reported in token-iterations (Σ len × steps waited), so the
//!    trade-off is visible.
//! 3. **Context-parallel sharding** (paper: fine-grained per-document sharding):
//!    per-sequence (the micro-batch's tokens, end to end, cut into 2·CP chunks) and
//!    per-document (every sample cut into 2·CP chunks); rank `r` takes chunks `r` and
//!    `2·CP−1−r`; and the adaptive per-micro-batch choice between the two by predicted
//!    latency, with every piece padded to the kernel's 128-token tile ([`choose_sharding`]).
//!
//! # Definitions
//!
//! - A *non-splittable document* is a [`Sample`]: a whole document, or a piece the packer
//!   already cut at `L` (WLB-LLM never splits a sample across micro-batches). `S_max` below
//!   the longest sample is an error.
//! - *Chunking* with remainder: a range of `n` tokens is cut into `2·CP` chunks of
//!   `b = ⌊n / 2CP⌋` tokens and the `e = n mod 2CP` remainder tokens are dealt round-robin
//!   over the ranks, head chunks first: chunk `r` (rank r's head) gets one more token when
//!   `r < e`, chunk `2CP−1−r` (rank r's tail) when `CP + r < e`. Ranks so differ by at most
//!   one token, and chunks may be empty for `n < 2·CP`.
//! - *CP must divide the chunking*: per-sequence sharding pads the micro-batch to a multiple
//!   of `2·CP` tokens (the padding is never computed); that padded length must still fit the
//!   `S_max` buffer, which holds for every micro-batch exactly when `2·CP` divides `S_max`.
//!   [`CpConfig::new`] rejects `CP = 0`, a tile of 0 tokens and `S_max mod 2·CP ≠ 0`.
//!
//! # Latency estimates
//!
//! W_a and W_l come from a [`LatencyModel`]. Until `cost/` has its kernel-efficiency model,
//! [`ConstantThroughput`] is the default: W_a = `AttnShape::fwd_flops(pairs, heads)` at a
//! constant attention throughput, W_l = tokens × linear FLOPs per token at a constant
//! throughput. Its parameters are assumptions, not measurements (see its docs).
//!
//! Pure: no I/O, no randomness; ties are broken by the lowest index, so outputs are a
//! function of the inputs only. May not touch `cost/` formulas or `grouping.rs`; builds Plans
//! only through `plan::build`.

pub mod lower;

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::cost::AttnShape;
use crate::cost::Mask;
use crate::error::{invalid, Result};
use crate::workload::{PackedSeq, Sample};

/// The kernel's tile: FlashAttention computes queries in blocks of 128 tokens.
pub const KERNEL_TILE: u32 = 128;

/// Latency estimates W_a (attention, quadratic in a document's length) and W_l (the linear
/// layers, linear in tokens) of one transformer layer, in seconds.
pub trait LatencyModel {
    /// W_a: core-attention forward latency of `pairs` query–key pairs.
    fn attention_s(&self, pairs: u64) -> f64;
    /// W_l: forward latency of the linear part (projections, MLP) for `tokens` tokens.
    fn linear_s(&self, tokens: u64) -> f64;
    /// The mask whose pairs a document's attention counts (causal unless the model's
    /// layers say otherwise).
    fn mask(&self) -> Mask {
        Mask::Causal
    }
    /// W_a of one whole document of `len` tokens: its exact pairs under
    /// [`LatencyModel::mask`].
    fn document_attention_s(&self, len: u32) -> f64 {
        self.attention_s(self.mask().pairs(u64::from(len)))
    }
    /// W_a(d) + W_l(d) for one document of `len` tokens.
    fn document_s(&self, len: u32) -> f64 {
        self.document_attention_s(len) + self.linear_s(u64::from(len))
    }
}

/// The default [`LatencyModel`]: constant throughputs over the FLOPs of `cost/`.
///
/// W_a(pairs) = `shape.fwd_flops(pairs, shape.heads_q) / attn_flops_per_s`;
/// W_l(tokens) = `tokens × linear_flops_per_token / linear_flops_per_s`.
/// Placeholder until `cost/` provides kernel-efficiency curves: the throughputs are
/// assumptions (see [`ConstantThroughput::h200_llama3_8b`]), not measurements.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConstantThroughput {
    /// The attention layer's shape (all its query heads run on the estimated GPU).
    pub shape: AttnShape,
    /// Attention FLOP/s the kernel sustains.
    pub attn_flops_per_s: f64,
    /// Forward FLOPs of the linear layers per token (2 × parameters of one layer).
    pub linear_flops_per_token: f64,
    /// Linear-layer FLOP/s.
    pub linear_flops_per_s: f64,
}

impl ConstantThroughput {
    /// Llama-3-8B's layer on one H200, assumed: attention at 500 TFLOP/s and GEMMs at
    /// 600 TFLOP/s (about half and 60% of the 989 TFLOP/s dense BF16 peak); linear FLOPs per
    /// token = 2 × (4096·(4096 + 2·1024) + 4096·4096 + 3·4096·14336) for QKV, O and the
    /// SwiGLU MLP.
    pub fn h200_llama3_8b() -> ConstantThroughput {
        let params = 4096.0 * (4096.0 + 2.0 * 1024.0) + 4096.0 * 4096.0 + 3.0 * 4096.0 * 14336.0;
        ConstantThroughput {
            shape: AttnShape {
                heads_q: 32,
                heads_kv: 8,
                head_dim: 128,
                dtype_bytes: 2,
                mask: crate::cost::Mask::Causal,
            },
            attn_flops_per_s: 500e12,
            linear_flops_per_token: 2.0 * params,
            linear_flops_per_s: 600e12,
        }
    }
}

impl LatencyModel for ConstantThroughput {
    fn attention_s(&self, pairs: u64) -> f64 {
        self.shape.fwd_flops(pairs, self.shape.heads_q) / self.attn_flops_per_s
    }

    fn linear_s(&self, tokens: u64) -> f64 {
        tokens as f64 * self.linear_flops_per_token / self.linear_flops_per_s
    }

    fn mask(&self) -> Mask {
        self.shape.mask
    }
}

/// Outlier delay: the thresholds `L_1 < … < L_{n+1}` of `n` FIFO queues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutlierDelay {
    /// `L_1 < … < L_{n+1}` tokens (at least two, so at least one queue).
    pub thresholds: Vec<u32>,
}

impl OutlierDelay {
    /// Checked thresholds.
    pub fn new(thresholds: Vec<u32>) -> Result<OutlierDelay> {
        let allowed = "at least two strictly increasing lengths L_1 < … < L_{n+1} with L_1 ≥ 1";
        let shown = format!("{thresholds:?}");
        if thresholds.len() < 2 || thresholds[0] == 0 || thresholds.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(invalid("outlier-thresholds", shown, allowed));
        }
        Ok(OutlierDelay { thresholds })
    }

    /// Number of queues `n`.
    pub fn queues(&self) -> usize {
        self.thresholds.len() - 1
    }

    /// The queue of a sample of `len` tokens, `None` below `L_1`.
    fn queue_of(&self, len: u32) -> Option<usize> {
        let n = self.queues();
        (0..n).rev().find(|&i| len >= self.thresholds[i])
    }
}

/// WLB-LLM's packing parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WlbConfig {
    /// Micro-batches per step `N` (all data-parallel ranks × gradient-accumulation steps).
    pub micro_batches: usize,
    /// Memory cap `S_max`: most tokens one micro-batch may hold.
    pub s_max: u32,
    /// Outlier delay; `None` (the default) trains every sample on its own step unless the
    /// memory cap forces a carry.
    pub outlier: Option<OutlierDelay>,
}

impl WlbConfig {
    /// Checked parameters.
    pub fn new(micro_batches: usize, s_max: u32, outlier: Option<OutlierDelay>) -> Result<Self> {
        if micro_batches < 1 {
            return Err(invalid(
                "micro-batches",
                micro_batches,
                "at least 1 micro-batch per step",
            ));
        }
        if s_max < 1 {
            return Err(invalid("s-max", s_max, "a memory cap S_max ≥ 1 token"));
        }
        Ok(WlbConfig {
            micro_batches,
            s_max,
            outlier,
        })
    }
}

/// A sample as placed by WLB-LLM, with its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Placed {
    /// The sample.
    pub sample: Sample,
    /// The step whose global batch brought it.
    pub arrived: u64,
    /// Steps it waited in an outlier queue.
    pub queued: u64,
    /// Steps it was carried because no micro-batch had room under `S_max`.
    pub carried: u64,
}

impl Placed {
    fn new(sample: Sample, arrived: u64) -> Placed {
        Placed {
            sample,
            arrived,
            queued: 0,
            carried: 0,
        }
    }

    /// The step it is (or will be) trained on if placed now: arrived + waited.
    pub fn step(&self) -> u64 {
        self.arrived + self.queued + self.carried
    }
}

/// One micro-batch of a step: samples end to end in placement order, at most `S_max` tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MicroBatch {
    /// The samples in placement order.
    pub samples: Vec<Placed>,
    /// Tokens held.
    pub tokens: u64,
    /// Estimated latency W = Σ W_a(d) + W_l(d), seconds.
    pub latency_s: f64,
}

impl MicroBatch {
    /// As a packed sequence of capacity `s_max` (the rest is padding).
    pub fn to_packed(&self, s_max: u32) -> PackedSeq {
        PackedSeq {
            samples: self.samples.iter().map(|p| p.sample).collect(),
            capacity: s_max,
        }
    }
}

/// The result of variable-length packing of one pool of samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VarLenPacking {
    /// `N` micro-batches.
    pub micro_batches: Vec<MicroBatch>,
    /// Samples that fitted nowhere under `S_max`, in the order they were tried.
    pub leftover: Vec<Placed>,
}

/// Variable-length packing of one pool: longest first (ties: earlier arrival, then document and offset),
/// each into the micro-batch with the least W if it stays ≤ `s_max` tokens, else into the one
/// with the fewest tokens if it fits there, else left over. Ties go to the lowest index.
pub fn var_len_pack<M: LatencyModel + ?Sized>(
    pool: &[Placed],
    micro_batches: usize,
    s_max: u32,
    model: &M,
) -> VarLenPacking {
    let mut order: Vec<Placed> = pool.to_vec();
    order.sort_by(|a, b| {
        b.sample
            .len
            .cmp(&a.sample.len)
            .then(a.arrived.cmp(&b.arrived))
            .then(a.sample.doc.cmp(&b.sample.doc))
            .then(a.sample.offset.cmp(&b.sample.offset))
    });
    let mut mbs: Vec<MicroBatch> = (0..micro_batches)
        .map(|_| MicroBatch {
            samples: Vec::new(),
            tokens: 0,
            latency_s: 0.0,
        })
        .collect();
    let mut leftover = Vec::new();
    let cap = u64::from(s_max);
    let mut least_w = MinTree::new(micro_batches);
    let mut fewest = MinTree::new(micro_batches);
    for p in order {
        let len = u64::from(p.sample.len);
        let target = [least_w.argmin(), fewest.argmin()]
            .into_iter()
            .flatten()
            .find(|&i| mbs[i].tokens + len <= cap);
        match target {
            Some(i) => {
                let m = &mut mbs[i];
                m.tokens += len;
                m.latency_s += model.document_s(p.sample.len);
                m.samples.push(p);
                least_w.set(i, m.latency_s);
                fewest.set(i, m.tokens as f64);
            }
            None => leftover.push(p),
        }
    }
    VarLenPacking {
        micro_batches: mbs,
        leftover,
    }
}

/// Index of the first minimum.
/// The lowest index holding the least value among `n` values (all 0 at first), kept as a
/// tournament tree: a change costs log n, the answer is its root. A pair's winner is the
/// right one only when strictly less, so ties go to the lower index, as a scan in index
/// order that replaces the best only by a strictly smaller value.
struct MinTree {
    /// Leaves from `size` on (unused ones +∞); node k holds its subtree's winner.
    node: Vec<u32>,
    value: Vec<f64>,
    size: usize,
    n: usize,
}

impl MinTree {
    fn new(n: usize) -> MinTree {
        let size = n.next_power_of_two();
        let mut value = vec![f64::INFINITY; size];
        value[..n].fill(0.0);
        let mut t = MinTree {
            node: vec![0; 2 * size],
            value,
            size,
            n,
        };
        for i in 0..size {
            t.node[size + i] = i as u32;
        }
        for k in (1..size).rev() {
            t.node[k] = t.winner(k);
        }
        t
    }

    fn winner(&self, k: usize) -> u32 {
        let (l, r) = (self.node[2 * k], self.node[2 * k + 1]);
        if self.value[r as usize] < self.value[l as usize] {
            r
        } else {
            l
        }
    }

    fn set(&mut self, i: usize, v: f64) {
        self.value[i] = v;
        let mut k = (self.size + i) / 2;
        while k >= 1 {
            self.node[k] = self.winner(k);
            k /= 2;
        }
    }

    fn argmin(&self) -> Option<usize> {
        (self.n > 0).then(|| self.node[1] as usize)
    }
}

/// What one step trains on, and what it leaves for later.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WlbStep {
    /// Step index (0 for the first call).
    pub step: u64,
    /// The `N` micro-batches.
    pub micro_batches: Vec<MicroBatch>,
    /// Samples carried to the next step (no room under `S_max`).
    pub carried: Vec<Placed>,
    /// Samples waiting in outlier queues after this step.
    pub queued: usize,
    /// Σ len × steps spent in an outlier queue, over the samples trained this step.
    pub outlier_delay_token_iters: u64,
    /// Σ len × steps carried, over the samples trained this step.
    pub carry_delay_token_iters: u64,
}

impl WlbStep {
    /// The largest estimated micro-batch latency (the straggler), seconds.
    pub fn max_latency_s(&self) -> f64 {
        self.micro_batches
            .iter()
            .map(|m| m.latency_s)
            .fold(0.0, f64::max)
    }

    /// Every sample trained this step.
    pub fn trained(&self) -> impl Iterator<Item = &Placed> {
        self.micro_batches.iter().flat_map(|m| &m.samples)
    }
}

/// WLB-LLM's packer over successive global batches (steps): holds the carried samples and
/// the outlier queues between steps.
pub struct WlbPacker<M> {
    cfg: WlbConfig,
    model: M,
    step: u64,
    carried: Vec<Placed>,
    queues: Vec<VecDeque<Placed>>,
}

impl<M: LatencyModel> WlbPacker<M> {
    /// A packer at step 0 with empty queues.
    pub fn new(cfg: WlbConfig, model: M) -> WlbPacker<M> {
        let queues = cfg.outlier.as_ref().map_or(0, OutlierDelay::queues);
        WlbPacker {
            cfg,
            model,
            step: 0,
            carried: Vec::new(),
            queues: vec![VecDeque::new(); queues],
        }
    }

    /// The configuration.
    pub fn config(&self) -> &WlbConfig {
        &self.cfg
    }

    /// Samples waiting in outlier queues, oldest first per queue, queue 1 first.
    pub fn pending(&self) -> impl Iterator<Item = &Placed> {
        self.queues.iter().flatten()
    }

    /// Packs the next step's global batch (its sequences' samples, in position order, are
    /// the step's arrivals). Errors, before any state changes, when a sample is longer than
    /// `S_max` or, with outlier delay, than `L_{n+1}`.
    pub fn step(&mut self, batch: &[PackedSeq]) -> Result<WlbStep> {
        let arrivals: Vec<Sample> = batch
            .iter()
            .flat_map(|s| s.samples.iter().copied())
            .collect();
        for s in &arrivals {
            if s.len > self.cfg.s_max {
                return Err(invalid(
                    "s-max",
                    self.cfg.s_max,
                    format!(
                        "at least the longest non-splittable sample: document {} (offset {}) \
                         has {} tokens",
                        s.doc, s.offset, s.len
                    ),
                ));
            }
            if let Some(od) = &self.cfg.outlier {
                let top = od.thresholds[od.thresholds.len() - 1];
                if s.len > top {
                    return Err(invalid(
                        "outlier-thresholds",
                        format!("{:?}", od.thresholds),
                        format!(
                            "a last threshold L_(n+1) ≥ the longest sample ({} tokens, \
                             document {})",
                            s.len, s.doc
                        ),
                    ));
                }
            }
        }
        let step = self.step;
        let n = self.cfg.micro_batches;
        let mut pool: Vec<Placed> = std::mem::take(&mut self.carried);
        for s in arrivals {
            let p = Placed::new(s, step);
            match self.cfg.outlier.as_ref().and_then(|od| od.queue_of(s.len)) {
                Some(q) => self.queues[q].push_back(p),
                None => pool.push(p),
            }
        }
        for q in &mut self.queues {
            if q.len() >= n {
                pool.extend(q.drain(..n));
            }
        }
        let packed = var_len_pack(&pool, n, self.cfg.s_max, &self.model);
        let mut out = WlbStep {
            step,
            micro_batches: packed.micro_batches,
            carried: Vec::new(),
            queued: 0,
            outlier_delay_token_iters: 0,
            carry_delay_token_iters: 0,
        };
        // Record the waits: every sample trained now has waited (step − arrived) steps in
        // total; the carries are counted as they happen, the rest was spent queued.
        for m in &mut out.micro_batches {
            for p in &mut m.samples {
                p.queued = step - p.arrived - p.carried;
                let len = u64::from(p.sample.len);
                out.outlier_delay_token_iters += len * p.queued;
                out.carry_delay_token_iters += len * p.carried;
            }
        }
        for q in &mut self.queues {
            for p in q.iter_mut() {
                p.queued += 1;
            }
        }
        self.carried = packed
            .leftover
            .into_iter()
            .map(|mut p| {
                p.queued = step - p.arrived - p.carried;
                p.carried += 1;
                p
            })
            .collect();
        out.carried = self.carried.clone();
        out.queued = self.queues.iter().map(VecDeque::len).sum();
        self.step += 1;
        Ok(out)
    }
}

/// Context-parallel sharding of a micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CpSharding {
    /// The micro-batch's tokens, end to end, cut into 2·CP chunks.
    PerSequence,
    /// Every sample cut into 2·CP chunks.
    PerDocument,
}

/// Checked context-parallel parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpConfig {
    /// CP group size.
    pub cp: u32,
    /// The kernel's query tile in tokens (pieces are padded to it in estimates).
    pub tile: u32,
}

impl CpConfig {
    /// Checks `cp ≥ 1`, `tile ≥ 1` and that `2·cp` divides `s_max` (module docs: "CP must
    /// divide the chunking").
    pub fn new(cp: u32, tile: u32, s_max: u32) -> Result<CpConfig> {
        if cp < 1 {
            return Err(invalid("cp", cp, "a context-parallel group of ≥ 1 rank"));
        }
        if tile < 1 {
            return Err(invalid(
                "tile",
                tile,
                "a kernel tile of ≥ 1 token (128 on H200)",
            ));
        }
        let chunks = 2 * u64::from(cp);
        if u64::from(s_max) % chunks != 0 {
            return Err(invalid(
                "cp",
                cp,
                format!(
                    "a CP size whose 2·CP = {chunks} chunks divide S_max = {s_max} tokens \
                     (per-sequence sharding pads a micro-batch to a multiple of 2·CP, which \
                     must stay within S_max)"
                ),
            ));
        }
        Ok(CpConfig { cp, tile })
    }
}

/// A contiguous run of query tokens of one sample assigned to one CP rank; it attends to
/// keys `[0, start + len)` of its sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CpPiece {
    /// Index of the sample in the micro-batch.
    pub sample: usize,
    /// First query token, relative to the sample.
    pub start: u32,
    /// Query tokens.
    pub len: u32,
}

impl CpPiece {
    /// Exact pairs under `mask` (causal: Σ_{q=start}^{start+len−1} (q + 1)).
    pub fn pairs(&self, mask: &Mask) -> u64 {
        let a = u64::from(self.start);
        mask.range_pairs(a, a + u64::from(self.len))
    }

    /// Pairs with the query count rounded up to whole tiles, queries [a, a + c') with
    /// `c' = ⌈len / tile⌉·tile` (causal: `c'·a + c'(c'+1)/2`; the kernel computes whole
    /// tiles; padded rows are wasted).
    pub fn padded_pairs(&self, tile: u32, mask: &Mask) -> u64 {
        let a = u64::from(self.start);
        let c = u64::from(self.len).div_ceil(u64::from(tile)) * u64::from(tile);
        mask.range_pairs(a, a + c)
    }
}

/// Per-rank pieces of one micro-batch.
pub type CpRanks = Vec<Vec<CpPiece>>;

/// The 2·CP chunk bounds of `n` tokens with the round-robin remainder (module docs), as
/// `(start, len)` per chunk index.
fn chunk_bounds(n: u64, cp: u32) -> Vec<(u64, u64)> {
    let cp = u64::from(cp);
    let (b, e) = (n / (2 * cp), n % (2 * cp));
    let mut start = 0;
    (0..2 * cp)
        .map(|i| {
            let extra = if i < cp {
                i < e
            } else {
                cp + (2 * cp - 1 - i) < e
            };
            let len = b + u64::from(extra);
            let c = (start, len);
            start += len;
            c
        })
        .collect()
}

/// The two chunks `(start, len)` of rank `r`: chunk `r` and chunk `2·CP−1−r` of `n` tokens.
pub fn rank_chunks(n: u64, cp: u32, r: u32) -> [(u64, u64); 2] {
    let b = chunk_bounds(n, cp);
    let r = r as usize;
    [b[r], b[b.len() - 1 - r]]
}

/// Tokens rank `r` holds of `n` tokens cut as [`rank_chunks`] cuts them (its two chunks),
/// in O(1): chunk r carries one of the e = n mod 2·CP remainder tokens when r < e, chunk
/// 2·CP−1−r when CP + r < e.
pub fn rank_share(n: u64, cp: u32, r: u32) -> u64 {
    let (cp, r) = (u64::from(cp), u64::from(r));
    let (b, e) = (n / (2 * cp), n % (2 * cp));
    2 * b + u64::from(r < e) + u64::from(cp + r < e)
}

/// Per-document sharding: every sample cut into 2·CP chunks, rank `r` takes chunks `r` and
/// `2·CP−1−r` (empty chunks are dropped).
pub fn shard_per_document(samples: &[Sample], cp: CpConfig) -> CpRanks {
    let mut ranks = vec![Vec::new(); cp.cp as usize];
    for (i, s) in samples.iter().enumerate() {
        let bounds = chunk_bounds(u64::from(s.len), cp.cp);
        for (r, pieces) in ranks.iter_mut().enumerate() {
            for (start, len) in [bounds[r], bounds[bounds.len() - 1 - r]] {
                if len > 0 {
                    pieces.push(CpPiece {
                        sample: i,
                        start: start as u32,
                        len: len as u32,
                    });
                }
            }
        }
    }
    ranks
}

/// Per-sequence sharding: the samples end to end, padded to a multiple of 2·CP tokens, cut
/// into 2·CP equal chunks; rank `r` takes chunks `r` and `2·CP−1−r`, each split at sample
/// boundaries into pieces (padding is dropped).
pub fn shard_per_sequence(samples: &[Sample], cp: CpConfig) -> CpRanks {
    let total: u64 = samples.iter().map(|s| u64::from(s.len)).sum();
    let chunks = 2 * u64::from(cp.cp);
    let chunk = total.div_ceil(chunks);
    let mut starts = Vec::with_capacity(samples.len());
    let mut at = 0u64;
    for s in samples {
        starts.push(at);
        at += u64::from(s.len);
    }
    let mut ranks = vec![Vec::new(); cp.cp as usize];
    for (r, pieces) in ranks.iter_mut().enumerate() {
        let r = r as u64;
        for c in [r, chunks - 1 - r] {
            let (lo, hi) = (c * chunk, ((c + 1) * chunk).min(total));
            for (i, (s, &st)) in samples.iter().zip(&starts).enumerate() {
                let (a, b) = (lo.max(st), hi.min(st + u64::from(s.len)));
                if a < b {
                    pieces.push(CpPiece {
                        sample: i,
                        start: (a - st) as u32,
                        len: (b - a) as u32,
                    });
                }
            }
        }
    }
    ranks
}

/// The predicted latency of one rank's pieces: W_a over their tile-padded pairs plus W_l
/// over their tokens.
pub fn rank_latency_s<M: LatencyModel + ?Sized>(pieces: &[CpPiece], tile: u32, model: &M) -> f64 {
    let mask = model.mask();
    let pairs: u64 = pieces.iter().map(|p| p.padded_pairs(tile, &mask)).sum();
    let tokens: u64 = pieces.iter().map(|p| u64::from(p.len)).sum();
    model.attention_s(pairs) + model.linear_s(tokens)
}

/// The adaptive choice for one micro-batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpChoice {
    /// The sharding with the smaller predicted latency (per-sequence on a tie).
    pub sharding: CpSharding,
    /// Predicted latency (slowest rank) under per-sequence sharding, seconds.
    pub per_sequence_s: f64,
    /// Predicted latency (slowest rank) under per-document sharding, seconds.
    pub per_document_s: f64,
    /// The chosen sharding's pieces per rank.
    pub ranks: CpRanks,
}

/// WLB-LLM's adaptive sharding selection: predict each sharding's slowest rank and keep the
/// faster one.
pub fn choose_sharding<M: LatencyModel + ?Sized>(
    samples: &[Sample],
    cp: CpConfig,
    model: &M,
) -> CpChoice {
    let predict = |ranks: &CpRanks| {
        ranks
            .iter()
            .map(|p| rank_latency_s(p, cp.tile, model))
            .fold(0.0, f64::max)
    };
    let seq = shard_per_sequence(samples, cp);
    let doc = shard_per_document(samples, cp);
    let (per_sequence_s, per_document_s) = (predict(&seq), predict(&doc));
    let (sharding, ranks) = if per_document_s < per_sequence_s {
        (CpSharding::PerDocument, doc)
    } else {
        (CpSharding::PerSequence, seq)
    };
    CpChoice {
        sharding,
        per_sequence_s,
        per_document_s,
        ranks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::causal_pairs;
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{batches, Packing};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// W_a = pairs seconds, W_l = 0: latencies are the hand-countable pair totals.
    struct Pairs;
    impl LatencyModel for Pairs {
        fn attention_s(&self, pairs: u64) -> f64 {
            pairs as f64
        }
        fn linear_s(&self, _tokens: u64) -> f64 {
            0.0
        }
    }

    fn sample(doc: u64, len: u32) -> Sample {
        Sample {
            doc,
            offset: 0,
            len,
            cut: false,
        }
    }

    fn pool(lens: &[u32]) -> Vec<Placed> {
        lens.iter()
            .enumerate()
            .map(|(i, &l)| Placed::new(sample(i as u64, l), 0))
            .collect()
    }

    fn lens(m: &MicroBatch) -> Vec<u32> {
        m.samples.iter().map(|p| p.sample.len).collect()
    }

    proptest! {
        /// The tournament tree answers what a scan in index order that keeps the first
        /// least value answers, after any changes (values from a small set: many ties).
        #[test]
        fn min_tree_is_the_first_least(
            n in 1usize..40,
            sets in proptest::collection::vec((0usize..40, 0u8..6), 0..80),
        ) {
            let mut t = MinTree::new(n);
            let mut v = vec![0.0f64; n];
            for (i, x) in sets {
                let i = i % n;
                v[i] = f64::from(x);
                t.set(i, v[i]);
                let mut best: Option<(usize, f64)> = None;
                for (j, &y) in v.iter().enumerate() {
                    if best.is_none_or(|(_, b)| y < b) {
                        best = Some((j, y));
                    }
                }
                prop_assert_eq!(t.argmin(), best.map(|(j, _)| j));
            }
            prop_assert_eq!(MinTree::new(0).argmin(), None);
        }
    }

    #[test]
    fn var_len_pack_by_hand() {
        // W(d) = d(d+1)/2: 8→36, 6→21, 5→15, 3→6, 2→3, 1→1.
        // 8→m0 (36), 6→m1 (21), 5→m1 (36, 11 tok), 3→m0 (tie, lowest; 42, 11 tok),
        // 2→m1 (39, 13 tok), 1→m1 (40, 14 tok).
        let p = var_len_pack(&pool(&[3, 8, 1, 5, 2, 6]), 2, 20, &Pairs);
        assert_eq!(lens(&p.micro_batches[0]), vec![8, 3]);
        assert_eq!(lens(&p.micro_batches[1]), vec![6, 5, 2, 1]);
        assert_eq!(p.micro_batches[0].latency_s, 42.0);
        assert_eq!(p.micro_batches[1].latency_s, 40.0);
        assert!(p.leftover.is_empty());
        // S_max = 12: 2 goes to m1 by W (11 + 2 > 12), then to the fewest-token micro-batch
        // (both 11, m0 first: 13 > 12) → left over; 1 → m1 (W 36 < 42), 12 tokens.
        let p = var_len_pack(&pool(&[3, 8, 1, 5, 2, 6]), 2, 12, &Pairs);
        assert_eq!(lens(&p.micro_batches[0]), vec![8, 3]);
        assert_eq!(lens(&p.micro_batches[1]), vec![6, 5, 1]);
        assert_eq!(
            p.leftover.iter().map(|p| p.sample.len).collect::<Vec<_>>(),
            vec![2]
        );
    }

    #[test]
    fn fallback_to_fewest_tokens() {
        // 6→m0 (W 21, 6 tok); 2,2,2→m1 (W 3, 6, 9; 6 tok). S_max 7:
        // 1 → least W m1 (9): 7 tokens, fits (W 10).
        // 1 → least W m1 (10 < 21): 8 > 7; fewest tokens is m0 (6): 7, fits.
        let p = var_len_pack(&pool(&[6, 2, 2, 2, 1, 1]), 2, 7, &Pairs);
        assert_eq!(lens(&p.micro_batches[0]), vec![6, 1]);
        assert_eq!(lens(&p.micro_batches[1]), vec![2, 2, 2, 1]);
        assert!(p.leftover.is_empty());
        assert_eq!(p.micro_batches[0].latency_s, 22.0);
        assert_eq!(p.micro_batches[1].latency_s, 10.0);
    }

    fn multiset<'a>(it: impl Iterator<Item = &'a Sample>) -> BTreeMap<Sample, usize> {
        let mut m = BTreeMap::new();
        for s in it {
            *m.entry(*s).or_insert(0) += 1;
        }
        m
    }

    fn batch_of(seqs: &[Vec<u32>], cap: u32) -> Vec<PackedSeq> {
        let mut doc = 0;
        seqs.iter()
            .map(|lens| PackedSeq {
                samples: lens
                    .iter()
                    .map(|&l| {
                        doc += 1;
                        sample(doc, l)
                    })
                    .collect(),
                capacity: cap,
            })
            .collect()
    }

    proptest! {
        /// Delay off, N micro-batches for a global batch of N sequences of L tokens and
        /// S_max ≥ L + longest sample: no carry can happen (when a sample of `len` tokens is
        /// placed, the fewest-token micro-batch holds ≤ (N·L − len)/N tokens), so each step
        /// trains exactly its own global batch's multiset of samples.
        #[test]
        fn delay_off_keeps_each_steps_multiset(
            steps in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(1u32..=64, 1..6), 4),
                1..5),
            n in 1usize..=4,
        ) {
            let cap = 64 * 5;
            let cfg = WlbConfig::new(n, cap + 64, None).unwrap();
            let mut packer = WlbPacker::new(cfg, ConstantThroughput::h200_llama3_8b());
            for seqs in &steps {
                let batch = batch_of(&seqs[..n], cap);
                let out = packer.step(&batch).unwrap();
                prop_assert!(out.carried.is_empty());
                prop_assert_eq!(out.micro_batches.len(), n);
                prop_assert!(out.micro_batches.iter().all(|m| m.tokens <= u64::from(cap + 64)));
                prop_assert_eq!(
                    multiset(out.trained().map(|p| &p.sample)),
                    multiset(batch.iter().flat_map(|s| &s.samples))
                );
                prop_assert_eq!(out.outlier_delay_token_iters + out.carry_delay_token_iters, 0);
            }
        }

        /// Any S_max ≥ the longest sample: every sample is trained exactly once, on its own
        /// step or a later one (carried), and never over S_max.
        #[test]
        fn carries_lose_nothing(
            steps in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(1u32..=64, 1..6), 1..6),
                1..6),
            n in 1usize..4,
            extra in 0u32..64,
        ) {
            let s_max = 64 + extra;
            let cfg = WlbConfig::new(n, s_max, None).unwrap();
            let mut packer = WlbPacker::new(cfg, Pairs);
            let mut seen = BTreeMap::new();
            let mut arrivals = BTreeMap::new();
            let mut doc = 0;
            for (t, seqs) in steps.iter().enumerate() {
                let mut batch = batch_of(seqs, 64 * 6);
                for s in batch.iter_mut().flat_map(|s| s.samples.iter_mut()) {
                    doc += 1;
                    s.doc = doc;
                    arrivals.insert(*s, t as u64);
                }
                let out = packer.step(&batch).unwrap();
                for m in &out.micro_batches {
                    prop_assert!(m.tokens <= u64::from(s_max));
                    for p in &m.samples {
                        prop_assert_eq!(p.step(), t as u64);
                        prop_assert_eq!(arrivals[&p.sample], p.arrived);
                        prop_assert!(seen.insert(p.sample, t).is_none());
                    }
                }
                let c: u64 = out.trained().map(|p| u64::from(p.sample.len) * p.carried).sum();
                prop_assert_eq!(out.carry_delay_token_iters, c);
            }
            // Drain: empty steps until nothing is carried.
            let mut t = steps.len() as u64;
            loop {
                let out = packer.step(&[]).unwrap();
                for p in out.trained() {
                    prop_assert!(seen.insert(p.sample, t as usize).is_none());
                }
                t += 1;
                if out.carried.is_empty() { break; }
                prop_assert!(t < 1000);
            }
            prop_assert_eq!(seen.len(), arrivals.len());
        }
    }

    #[test]
    fn outlier_delay_trains_every_delayed_sample_later_and_loses_none() {
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let (l, n) = (65_536, 8);
        let od = OutlierDelay::new(vec![16_384, 32_768, l]).unwrap();
        let cfg = WlbConfig::new(n, 2 * l, Some(od)).unwrap();
        let mut packer = WlbPacker::new(cfg, ConstantThroughput::h200_llama3_8b());
        let mut arrived = BTreeMap::new();
        let mut trained = BTreeMap::new();
        let (mut delayed, mut reported, mut queue_token_steps) = (0, 0u64, 0u64);
        for (t, batch) in batches(&corpus, l, n, Packing::Sequential, 3, 0)
            .unwrap()
            .take(40)
            .enumerate()
        {
            let t = t as u64;
            for s in batch.iter().flat_map(|s| &s.samples) {
                arrived.insert(*s, t);
            }
            let out = packer.step(&batch).unwrap();
            for p in out.trained() {
                assert!(trained.insert(p.sample, t).is_none(), "trained twice");
                assert_eq!(p.arrived, arrived[&p.sample]);
                assert_eq!(p.step(), t);
                if p.queued > 0 {
                    delayed += 1;
                    assert!(p.sample.len >= 16_384, "only outliers are delayed");
                    assert!(t > p.arrived, "a delayed sample is trained on a later step");
                }
            }
            let by_hand: u64 = out
                .trained()
                .map(|p| u64::from(p.sample.len) * p.queued)
                .sum();
            assert_eq!(out.outlier_delay_token_iters, by_hand);
            reported += out.outlier_delay_token_iters;
            // Independent count: every step a sample spends in a queue adds its tokens.
            queue_token_steps += packer
                .pending()
                .map(|p| u64::from(p.sample.len))
                .sum::<u64>();
            for p in &out.carried {
                assert!(!trained.contains_key(&p.sample));
            }
        }
        // None lost: trained, still queued and carried are disjoint and make up the arrivals.
        let pending: Vec<_> = packer.pending().map(|p| p.sample).collect();
        let carried = packer.carried.clone();
        assert!(pending.iter().all(|s| !trained.contains_key(s)));
        assert_eq!(trained.len() + pending.len() + carried.len(), arrived.len());
        assert!(pending.iter().all(|s| s.len >= 16_384));
        let pending_wait: u64 = packer
            .pending()
            .chain(&carried)
            .map(|p| u64::from(p.sample.len) * p.queued)
            .sum();
        assert_eq!(reported + pending_wait, queue_token_steps);
        // The corpus has outliers and some were really delayed.
        assert!(delayed > 0 && reported > 0);
    }

    #[test]
    fn outlier_queue_releases_n_oldest_by_hand() {
        // N = 2, one queue [10, 100]. Step 0 brings a 12 and a 3: the 12 waits (queue 1 < 2).
        // Step 1 brings a 20 and a 4: the queue holds 2 → both leave now.
        let od = OutlierDelay::new(vec![10, 100]).unwrap();
        let mut p = WlbPacker::new(WlbConfig::new(2, 200, Some(od)).unwrap(), Pairs);
        let s0 = p.step(&batch_of(&[vec![12, 3]], 200)).unwrap();
        assert_eq!(s0.queued, 1);
        assert_eq!(
            s0.trained().map(|p| p.sample.len).collect::<Vec<_>>(),
            vec![3]
        );
        let s1 = p.step(&batch_of(&[vec![20, 4]], 200)).unwrap();
        assert_eq!(s1.queued, 0);
        let mut got: Vec<_> = s1.trained().map(|p| (p.sample.len, p.queued)).collect();
        got.sort();
        assert_eq!(got, vec![(4, 0), (12, 1), (20, 0)]);
        assert_eq!(s1.outlier_delay_token_iters, 12);
        // Longest first onto distinct micro-batches: 20 and 12 split up.
        assert_eq!(lens(&s1.micro_batches[0]), vec![20]);
        assert_eq!(lens(&s1.micro_batches[1]), vec![12, 4]);
    }

    #[test]
    fn deterministic_over_steps() {
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let run = || -> Vec<WlbStep> {
            let od = OutlierDelay::new(vec![8_192, 32_768]).unwrap();
            let cfg = WlbConfig::new(4, 40_000, Some(od)).unwrap();
            let mut p = WlbPacker::new(cfg, ConstantThroughput::h200_llama3_8b());
            batches(&corpus, 32_768, 4, Packing::Sequential, 11, 1)
                .unwrap()
                .take(12)
                .map(|b| p.step(&b).unwrap())
                .collect()
        };
        let a = run();
        assert_eq!(a, run());
        // S_max = 40000 < L + longest: this configuration does carry, and delays outliers.
        assert!(a.iter().any(|s| !s.carried.is_empty()));
        assert!(a.iter().any(|s| s.outlier_delay_token_iters > 0));
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let mut p = WlbPacker::new(WlbConfig::new(2, 100, None).unwrap(), Pairs);
        let e = p
            .step(&batch_of(&[vec![150]], 200))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s-max") && e.contains("100") && e.contains("150"),
            "{e}"
        );
        // State untouched: the next good step is step 0.
        assert_eq!(p.step(&batch_of(&[vec![5]], 200)).unwrap().step, 0);
        assert!(WlbConfig::new(0, 100, None).is_err());
        assert!(WlbConfig::new(1, 0, None).is_err());
        assert!(OutlierDelay::new(vec![10]).is_err());
        assert!(OutlierDelay::new(vec![10, 10]).is_err());
        assert!(OutlierDelay::new(vec![0, 10]).is_err());
        let od = OutlierDelay::new(vec![10, 50]).unwrap();
        let mut p = WlbPacker::new(WlbConfig::new(1, 100, Some(od)).unwrap(), Pairs);
        let e = p.step(&batch_of(&[vec![60]], 200)).unwrap_err().to_string();
        assert!(e.contains("outlier-thresholds") && e.contains("60"), "{e}");
        // CP: 2·3 = 6 does not divide 65536.
        let e = CpConfig::new(3, 128, 65_536).unwrap_err().to_string();
        assert!(e.contains("cp = 3") && e.contains("65536"), "{e}");
        assert!(CpConfig::new(0, 128, 65_536).is_err());
        assert!(CpConfig::new(4, 0, 65_536).is_err());
        assert!(CpConfig::new(4, 128, 65_536).is_ok());
    }

    fn rank_pairs(ranks: &CpRanks) -> Vec<u64> {
        ranks
            .iter()
            .map(|r| r.iter().map(|p| p.pairs(&Mask::Causal)).sum())
            .collect()
    }

    #[test]
    fn rank_share_is_the_two_chunks() {
        for n in 0..70u64 {
            for cp in 1..6u32 {
                for r in 0..cp {
                    let [a, b] = rank_chunks(n, cp, r);
                    assert_eq!(rank_share(n, cp, r), a.1 + b.1, "n {n} cp {cp} r {r}");
                }
            }
        }
    }

    #[test]
    fn per_document_sharding_by_hand() {
        let cp = CpConfig::new(2, 128, 64).unwrap();
        // 16 tokens, 4 chunks of 4: rank 0 = [0,4) + [12,16) = 10 + (4·12 + 10) = 68;
        // rank 1 = [4,8) + [8,12) = (16 + 10) + (32 + 10) = 68. Total 136 = 16·17/2.
        let r = shard_per_document(&[sample(0, 16)], cp);
        assert_eq!(rank_pairs(&r), vec![68, 68]);
        assert_eq!(
            r[0],
            vec![
                CpPiece {
                    sample: 0,
                    start: 0,
                    len: 4
                },
                CpPiece {
                    sample: 0,
                    start: 12,
                    len: 4
                }
            ]
        );
        // 10 tokens: b = 2, e = 2 → chunk 0 (rank 0 head) and chunk 1 (rank 1 head) get one
        // more: chunks 3,3,2,2 = [0,3) [3,6) [6,8) [8,10).
        // rank 0: [0,3) + [8,10) = 6 + (2·8 + 3) = 25; rank 1: [3,6) + [6,8) = 15 + 15 = 30.
        let r = shard_per_document(&[sample(0, 10)], cp);
        assert_eq!(rank_pairs(&r), vec![25, 30]);
        // 11 tokens: e = 3 → chunk 3 (rank 0 tail, CP + 0 < 3) also: 3,3,2,3.
        assert_eq!(chunk_bounds(11, 2), vec![(0, 3), (3, 3), (6, 2), (8, 3)]);
        // 3 tokens with CP 2: b = 0, e = 3 → rank 0 head, rank 1 head, rank 0 tail get a
        // token each: chunks 1,1,0,1; rank 0 = [0,1) + [2,3) = 1 + 3, rank 1 = [1,2) = 2.
        let r = shard_per_document(&[sample(0, 3)], cp);
        assert_eq!(
            r[0],
            vec![
                CpPiece {
                    sample: 0,
                    start: 0,
                    len: 1
                },
                CpPiece {
                    sample: 0,
                    start: 2,
                    len: 1
                }
            ]
        );
        assert_eq!(rank_pairs(&r), vec![4, 2]);
    }

    #[test]
    fn per_sequence_sharding_by_hand() {
        // Samples 12 and 4 (16 tokens), CP 2 → chunks of 4 over the sequence:
        // rank 0: seq [0,4) = s0 [0,4) → 10; seq [12,16) = s1 [0,4) → 10. Total 20.
        // rank 1: seq [4,12) = s0 [4,12) → 8·4 + 36 = 68. Imbalanced: 20 vs 68.
        let cp = CpConfig::new(2, 128, 64).unwrap();
        let r = shard_per_sequence(&[sample(0, 12), sample(1, 4)], cp);
        assert_eq!(rank_pairs(&r), vec![20, 68]);
        assert_eq!(
            r[1].len(),
            2,
            "rank 1's two chunks are pieces [4,8) and [8,12) of s0"
        );
        // Per-document on the same: s0 chunks 3 each, s1 chunks 1 each → balanced
        // s0: rank0 [0,3)+[9,12) = 6 + 27+6 = 39; rank1 [3,6)+[6,9) = 15 + 24 = 39.
        // s1: rank0 [0,1)+[3,4) = 1 + 4 = 5; rank1 [1,2)+[2,3) = 2 + 3 = 5.
        let r = shard_per_document(&[sample(0, 12), sample(1, 4)], cp);
        assert_eq!(rank_pairs(&r), vec![44, 44]);
    }

    proptest! {
        /// Both shardings cover every token of every sample exactly once and conserve the
        /// causal pairs; per-document ranks differ by at most one token per sample.
        #[test]
        fn sharding_covers_every_token_once(
            lens in proptest::collection::vec(1u32..300, 1..8),
            cp in 1u32..6,
        ) {
            let samples: Vec<Sample> =
                lens.iter().enumerate().map(|(i, &l)| sample(i as u64, l)).collect();
            let total_pairs: u64 = lens.iter().map(|&l| causal_pairs(u64::from(l))).sum();
            let cfg = CpConfig::new(cp, 128, 2 * cp * 1000).unwrap();
            for ranks in [shard_per_sequence(&samples, cfg), shard_per_document(&samples, cfg)] {
                prop_assert_eq!(ranks.len(), cp as usize);
                let mut hit: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0; l as usize]).collect();
                for p in ranks.iter().flatten() {
                    for t in p.start..p.start + p.len {
                        hit[p.sample][t as usize] += 1;
                    }
                }
                prop_assert!(hit.iter().flatten().all(|&h| h == 1));
                prop_assert_eq!(rank_pairs(&ranks).iter().sum::<u64>(), total_pairs);
            }
            let doc = shard_per_document(&samples, cfg);
            for (i, &l) in lens.iter().enumerate() {
                let per: Vec<u32> = doc.iter()
                    .map(|r| r.iter().filter(|p| p.sample == i).map(|p| p.len).sum())
                    .collect();
                let (lo, hi) = (per.iter().min().unwrap(), per.iter().max().unwrap());
                prop_assert!(hi - lo <= 1);
                prop_assert_eq!(per.iter().sum::<u32>(), l);
            }
        }
    }

    #[test]
    fn adaptive_choice_by_predicted_latency() {
        // One long document: per-sequence puts the causal tail's heavy rows unevenly
        // (samples 12+4 case above scaled ×128); per-document balances it.
        let cp = CpConfig::new(2, 128, 4096).unwrap();
        let c = choose_sharding(&[sample(0, 1536), sample(1, 512)], cp, &Pairs);
        // per-sequence: chunks of 512: rank 0 = s0[0,512) + s1[0,512) =
        // 2·131328 = 262656; rank 1 = s0[512,1536) = 1024·512 + 524800 = 1049088.
        assert_eq!(c.per_sequence_s, 1_049_088.0);
        // per-document: s0 chunks 384 (3 tiles, no padding), s1 chunks 128: each rank gets
        // half of s0's 1180416 and of s1's 131328 pairs = 590208 + 65664 = 655872.
        assert_eq!(c.per_document_s, 655_872.0);
        assert_eq!(c.sharding, CpSharding::PerDocument);
        // Many short documents: per-document chunks of 16 tokens are each padded to a whole
        // 128-token tile, so per-sequence (balanced anyway: 32 docs of 64, chunks of 512
        // on document boundaries) wins.
        let cp = CpConfig::new(2, 128, 4096).unwrap();
        let docs: Vec<Sample> = (0..32).map(|i| sample(i, 64)).collect();
        let c = choose_sharding(&docs, cp, &Pairs);
        // per-sequence: each rank holds 16 whole docs of 64 (padded to 128: 8256 each).
        assert_eq!(c.per_sequence_s, 16.0 * 8256.0);
        // per-document: each doc gives each rank 2 pieces of 16 tokens at starts 0/48 and
        // 16/32, each padded to 128: 128·a + 8256 → rank 0 = 8256 + 128·48 + 8256 = 22656,
        // rank 1 = 128·16 + 8256 + 128·32 + 8256 = 22656; × 32 docs.
        assert_eq!(c.per_document_s, 32.0 * 22656.0);
        assert_eq!(c.sharding, CpSharding::PerSequence);
    }

    #[test]
    fn default_estimator_uses_cost_flops() {
        let m = ConstantThroughput::h200_llama3_8b();
        // 1000 pairs × 32 heads × 4·128 FLOPs = 16.384 MFLOP at 500 TFLOP/s.
        assert!((m.attention_s(1000) - 16.384e6 / 500e12).abs() < 1e-18);
        // 218.1 M params per layer → 436.2 MFLOP per token at 600 TFLOP/s.
        let params = 4096.0 * 6144.0 + 4096.0 * 4096.0 + 3.0 * 4096.0 * 14336.0;
        assert!((m.linear_s(10) - 10.0 * 2.0 * params / 600e12).abs() < 1e-18);
        assert!(m.document_s(100) > m.linear_s(100));
    }
}
