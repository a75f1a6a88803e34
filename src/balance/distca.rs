//! DistCA (Zhuang, Chen et al., "Efficient Long-context Language Model Training by Core
//! Attention Disaggregation", arXiv:2510.18121): the planning half.
//!
//! Owns the core-attention schedulers and the ping-pong nano-batch split, and their
//! lowering to a `Plan` ([`lower`], through `plan::build`). May not touch the engine,
//! `cost/` formulas or `grouping.rs`; FLOPs and bytes come from [`AttnShape`] only.
//!
//! Two schedulers ([`DistcaScheduler`]): the public repository's planner on its mirrored
//! layout ([`reference`](mod@reference), the arm `distca`), and the one this page describes, skewsim's
//! *tight* scheduler (`distca:tight`). [`schedule_step`] and [`schedule_nanos`] pick by
//! [`DistcaConfig::scheduler`].
//!
//! # Where the tight scheduler departs from the repository, and why
//!
//! - *Layout:* contiguous L/CP slices (Ulysses' layout) instead of the repository's
//!   mirrored head/tail chunks, so a rank's work grows with its position in a long document.
//! - *Recipient and stop:* it always serves the largest current deficit and ends only when
//!   every server is within ε·F̄ or no move helps any deficit; the repository plans each
//!   initial recipient to the end and drops it as soon as the best candidate cannot move a
//!   query, which leaves servers far above F̄ when long documents dominate.
//! - *Priority:* FLOPs per byte actually moved (Q, output, and only the K/V prefix the
//!   target lacks, once per document and target) instead of the repository's Q plus the
//!   whole document's K/V per pair: it prices what the lowering sends.
//! - *Split:* the outer ends of a range (its first and last k queries, whole 128-token
//!   tiles), a head-only shard, coarse items first and a fallback into tolerance above F̄,
//!   instead of k single queries from the inner ends: so a rank holding the end of a long
//!   document can still be trimmed into small deficits.
//! - *Sources:* out-of-tolerance surplus servers before any surplus server, so moves drain
//!   the servers that break the stopping rule.
//!
//! # In-place attention servers (paper: "in-place attention servers")
//!
//! Every GPU keeps the baseline's token layout for its context-independent (linear) layers
//! and also serves core-attention tasks; the attention pool is the whole cluster (DP·CP
//! servers). Replica `r`'s packed sequence of L tokens lies on its CP ranks as contiguous
//! slices of ⌈L/CP⌉ tokens (Ulysses' layout, `plan::build::contiguous_layout`), so a
//! document may span several ranks; server `r·CP + c` is rank `c` of replica `r`. Its
//! initial ("in place") tasks are, per document it holds, the document's queries on it:
//! `[a, e)`, reading the keys `[0, e)`, of which `[a, e)` are its own and the rest lie on
//! earlier ranks of the same replica ([`home_ranges`]). With CP = 1 a server holds whole
//! documents and the tasks are whole samples.
//!
//! # Scheduler (paper: the communication-aware greedy scheduler)
//!
//! Loads are counted in exact query–key pairs under the shape's mask (`AttnShape::mask`,
//! [`Mask::range_pairs`]; FLOPs = `AttnShape::fwd_flops(pairs, heads_q)`, a constant
//! factor, so ratios and balance are the same in either unit), and a move's K/V is what
//! its queries reach under the mask, [`Mask::key_start`] of its first query to its last
//! query + 1. The formulas below are the causal ones (the mask's pairs are at most the
//! causal pairs, so a causal shard size is where the search for the mask's starts,
//! `largest_fitting`); under another mask a range's keys start at key_start(lo) instead
//! of 0 and a tile's cost is also bounded by tile × the mask's most keys per query.
//! The ideal load is F̄ = total / P. A server is *in surplus* above F̄ and *in deficit* below
//! it; it is *within tolerance* when |F_s − F̄| ≤ ε·F̄. Until every server is within
//! tolerance:
//!
//! 1. the target is the deficit server with the largest deficit (lowest index on a tie)
//!    that has not been found stuck;
//! 2. candidate items are those still on a *source*: in phase 1 a surplus server out of
//!    tolerance (so moves drain the servers that break the stopping rule, and none drains
//!    a server that is already fine); in phase 2 — once no such server is left, or none of
//!    them can help any target — any surplus server. Phase 0 comes first (skewsim's
//!    extension): only *coarse* items of out-of-tolerance sources, as far as the source's
//!    *exportable* pairs cannot cover its surplus. An item's exportable pairs are those
//!    that can leave in moves of ≤ ⌊ε·F̄⌋ each (all of it if that small, else its leading
//!    tiles whose one-tile head costs ≤ ⌊ε·F̄⌋); a coarse item has none: its smallest
//!    move, one tile over a long prefix, exceeds what a nearly full target can take. With
//!    ping-pong a nano-batch's F̄ is small and the end of a long document is such an item;
//!    when cheap items filled the deficits first it could no longer move and its rank
//!    stayed at 10–30× F̄, so coarse items go first, while the deficits are large;
//! 3. for each candidate ΔF_max = min(F_item, surplus of its server, deficit of the target);
//!    the item moves *whole* if F_item ≤ ΔF_max, else a *head+tail shard* moves: the
//!    first `k` and last `k` queries of the item's range `[lo, hi)`, `k` the largest
//!    multiple of the 128-token tile with k·(lo + hi + 1) ≤ ΔF_max. (A head+tail pair of
//!    `k` costs exactly k·(lo + hi + 1) pairs and leaves `[lo + k, hi − k)` with the same
//!    lo + hi, so the causal cost splits evenly, shard after shard.) When not even one
//!    tile pair fits, a *head-only* shard `[lo, lo + k)` in whole tiles is tried (cost
//!    k·lo + k(k+1)/2, the cheapest queries of the item): skewsim's extension, so that the
//!    last long document of a server can still be trimmed into small leftover deficits.
//! 4. the move with the best ratio of FLOPs moved to bytes moved wins (ties: lowest item,
//!    items numbered by server then position); bytes = Q and output of the moved queries
//!    (`q_bytes`, from and back to the item's home) + K and V of the key prefix they
//!    attend to, `[0, last query + 1)`, *less the keys the target already holds* (a target
//!    on an earlier CP rank of the same replica holds part of the prefix; any other holds
//!    none) *or has already received* — an earlier move of this schedule that sent it keys
//!    `[0, d)` of the same sample makes those free, as the lowering ships K and V once per
//!    (sample, destination) — sent by whichever ranks hold them (`kv_bytes`). So a second
//!    shard of a document on the same target costs only its Q, output and the keys beyond
//!    `d`, and consolidating a document's shards is as cheap as it is in the plan;
//! 5. when no candidate gives a move, the target may take one that leaves it *within
//!    tolerance above* F̄: steps 3–4 again with ΔF_max = min(F_item, surplus, deficit +
//!    ⌊ε·F̄⌋) (skewsim's extension, like the head-only shard: with CP > 1 a rank holding
//!    the end of a long document carries many F̄ of work whose smallest shard — one tile
//!    over a prefix of 100K keys — exceeds the small deficits left once cheaper items have
//!    filled the pool; without it such a rank stays at 10× F̄). In phase 0 a target with
//!    no such move may also take a coarse shard into the room of its own exportable pairs
//!    (ΔF_max = min(F_item, give, deficit + ⌊ε·F̄⌋ + exportable)): it becomes an
//!    out-of-tolerance source and gives them away in phase 1; its surplus exceeds its
//!    exportable pairs by ≤ ⌊ε·F̄⌋, any move lowers both alike (by at most the pairs moved
//!    for the exportable), and every deficit server can take one ≤ ⌊ε·F̄⌋ piece, so it ends
//!    within tolerance;
//! 6. a target with no candidate giving a move even so is *stuck* for the phase (moves only
//!    shrink every ΔF_max and the set of sources); the scheduler stops when all servers are
//!    within tolerance ([`Stop::Balanced`]) or every deficit server is stuck in phase 2
//!    ([`Stop::NoMoveHelps`]).
//!
//! Surplus servers only lose work down to F̄ and deficit servers only gain up to F̄ (F̄ +
//! ε·F̄ through step 5, then back to there); received tasks are never moved again. Each move lowers
//! Σ_s |F_s − F̄| by at least 2·min(moved, deficit) > 0, so the scheduler ends. Items are
//! keyed by the ratio of their whole move
//! to the most favourable target (one holding the largest block of the prefix any other
//! rank holds, m ≤ lo, plus the most keys of the sample delivered to any target, d_max):
//! while A = m + d_max ≤ lo, k·(lo + hi + 1) / (4k·q + kv) grows with k, and so does a
//! head shard's ratio (pairs convex in k from 0 over bytes affine in k with a
//! non-negative intercept, as the keys missing, lo + k − A, are ≥ k), which equals the
//! whole move's at k = hi − lo; once A > lo the key is the larger of the whole move's
//! ratio (with hi − A keys) and the KV-free head `[lo, A)`'s: a head shard's ratio is a
//! convex function of k over a positive affine one, so on k ≥ A − lo it peaks at an end,
//! and below A − lo it grows with k; the items of a sample are re-keyed when d_max grows. So the key bounds every move of the item to
//! every target and the search stops early.
//!
//! A task left in place still reads the part of its key prefix held by earlier CP ranks of
//! its replica (as CP's KV exchange does): [`AttnTask::kv_bytes`], counted in
//! [`DistcaSchedule::bytes`] next to the moved tasks' [`Transfer`]s.
//!
//! # Ping-pong (paper: "ping-pong execution")
//!
//! Each micro-batch is split into two nano-batches and each is scheduled on its own
//! ([`schedule_ping_pong_cp`]): the engine overlaps nano-batch 0's attention transfers with
//! nano-batch 1's compute and the other way round. The split is per rank, over the rank's
//! own query ranges (whole ranges, never cut): heaviest (pairs under the mask) first onto the half
//! with fewer pairs (the first half on a tie), each half then in position order
//! ([`nano_split`]; by pairs, not tokens, since the pairs are what each nano-batch's
//! scheduler must balance: by tokens a 6K-token end of an 88K-token document and a 6K
//! token short document weigh the same);
//! two pins keep it causal: ranks of a replica are split in order, a range continuing a
//! document whose piece on the previous rank is in nano-batch 1 goes to nano-batch 1 too,
//! and a range continuing onto the next rank goes to nano-batch 0 ([`nano_splits`]), so a
//! nano-batch-0 task never reads K/V of nano-batch-1 tokens. A rank whose only range is
//! part of one long document cannot be split (its one range is a whole nano-batch). With
//! CP = 1 this is a split of each micro-batch's whole samples by pairs. This module only
//! describes the split.

pub mod lower;
pub mod pingpong;
pub mod reference;
pub mod ticks;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

use crate::cost::{AttnShape, Mask};
use crate::error::{invalid, Result};
use crate::workload::{PackedSeq, Sample};

/// The default tolerance ε.
pub const DEFAULT_EPSILON: f64 = 0.10;

/// Which core-attention scheduler plans a DistCA step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DistcaScheduler {
    /// The public repository's planner on its mirrored head/tail layout ([`reference`](mod@reference)):
    /// the arm `distca`.
    #[default]
    Reference,
    /// This module's communication-aware scheduler on the contiguous CP layout: the arm
    /// `distca:tight`.
    Tight,
}

/// Checked scheduler parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistcaConfig {
    /// The attention shape one server computes with (heads as held on one GPU).
    pub shape: AttnShape,
    /// Tolerance ε: a server is balanced when |F_s − F̄| ≤ ε·F̄.
    pub epsilon: f64,
    /// Shard granularity in tokens (the kernel tile, 128; the tight scheduler's only).
    pub tile: u32,
    /// The scheduler ([`DistcaScheduler::Reference`] unless set).
    #[serde(default)]
    pub scheduler: DistcaScheduler,
}

impl DistcaConfig {
    /// Checks ε ≥ 0 (finite), a tile ≥ 1 token and at least one head of each kind.
    pub fn new(shape: AttnShape, epsilon: f64, tile: u32) -> Result<DistcaConfig> {
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(invalid(
                "epsilon",
                epsilon,
                "a finite tolerance ε ≥ 0 (0.10 default: every server within ±10% of F̄)",
            ));
        }
        if tile < 1 {
            return Err(invalid(
                "tile",
                tile,
                "a shard granularity of ≥ 1 token (128)",
            ));
        }
        if shape.heads_q < 1 || shape.heads_kv < 1 {
            return Err(invalid(
                "heads",
                format!("{}/{}", shape.heads_q, shape.heads_kv),
                "at least one query head and one KV head",
            ));
        }
        Ok(DistcaConfig {
            shape,
            epsilon,
            tile,
            scheduler: DistcaScheduler::default(),
        })
    }

    /// The same parameters for `scheduler`.
    pub fn with_scheduler(self, scheduler: DistcaScheduler) -> DistcaConfig {
        DistcaConfig { scheduler, ..self }
    }
}

/// A sample by position: `batch[seq].samples[index]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleRef {
    /// The replica whose micro-batch holds the sample (its Q, K, V and output live on that
    /// replica's CP ranks; with CP = 1 this is the server).
    pub seq: u32,
    /// Position of the sample in that micro-batch.
    pub index: u32,
}

/// One core-attention task: some query ranges of one sample over a prefix of its keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttnTask {
    /// Which sample.
    pub sample: SampleRef,
    /// The server holding the task's queries (its home: Q comes from and the output goes
    /// back to it).
    pub home: u32,
    /// The sample itself.
    pub of: Sample,
    /// Query ranges `[lo, hi)`, relative to the sample, ascending (one, or a head+tail pair).
    pub q_ranges: Vec<(u32, u32)>,
    /// The keys needed end at `kv_prefix` (= the last query + 1); they start at the mask's
    /// key_start of the first query (0 under the causal mask).
    pub kv_prefix: u32,
    /// Bytes of K and V of that prefix the executing server does not hold (received from
    /// the ranks holding them; for a task left in place, the earlier CP ranks' part). A
    /// moved task is charged only keys no earlier move of the schedule brought to the
    /// server: together the moved tasks of one sample on one server pay the longest
    /// prefix among them once.
    pub kv_bytes: u64,
    /// Exact pairs under the shape's mask.
    pub pairs: u64,
    /// Forward FLOPs (`AttnShape::fwd_flops(pairs, heads_q)`).
    pub flops: f64,
}

/// The data one moved task needs: Q from its home to the executing server, the K and V of
/// its key prefix that server does not hold (from the ranks holding them: the home and
/// earlier CP ranks of the same replica), and the output back to the home.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    /// The task's home server.
    pub src: u32,
    /// The server that executes the task.
    pub dst: u32,
    /// Index of the task in `servers[dst].tasks`.
    pub task: usize,
    /// Bytes of Q, src → dst.
    pub q_bytes: u64,
    /// Bytes of K and V of the prefix the executing server does not hold and has not
    /// received with an earlier move of the schedule, holders → dst.
    pub kv_bytes: u64,
    /// Bytes of the attention output, dst → src.
    pub out_bytes: u64,
}

impl Transfer {
    /// All bytes the move costs.
    pub fn bytes(&self) -> u64 {
        self.q_bytes + self.kv_bytes + self.out_bytes
    }
}

/// One attention server's work.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerWork {
    /// Its tasks: what stayed of its own home ranges, in position order, then what it
    /// received, in move order.
    pub tasks: Vec<AttnTask>,
    /// Σ pairs of its tasks.
    pub pairs: u64,
    /// Σ FLOPs of its tasks.
    pub flops: f64,
}

/// Why the scheduler stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stop {
    /// Every server is within ε·F̄ of F̄.
    Balanced,
    /// Some server is not, but no move helps any deficit server.
    NoMoveHelps,
}

/// The scheduler's output for one (nano-)batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistcaSchedule {
    /// Per server, its tasks.
    pub servers: Vec<ServerWork>,
    /// Per moved task, its transfers.
    pub transfers: Vec<Transfer>,
    /// F̄ = total FLOPs / servers.
    pub ideal_flops: f64,
    /// The tolerance ε it ran with.
    pub epsilon: f64,
    /// CP ranks per replica (server s is rank s mod CP of replica s / CP).
    pub cp: u32,
    /// Why it stopped.
    pub stop: Stop,
}

impl DistcaSchedule {
    /// Total FLOPs over all servers.
    pub fn total_flops(&self) -> f64 {
        self.servers.iter().map(|s| s.flops).sum()
    }

    /// max_s |F_s − F̄| / F̄ (0 for an empty batch).
    pub fn max_deviation(&self) -> f64 {
        if self.ideal_flops <= 0.0 {
            return 0.0;
        }
        self.servers
            .iter()
            .map(|s| (s.flops - self.ideal_flops).abs() / self.ideal_flops)
            .fold(0.0, f64::max)
    }

    /// Bytes of the moved tasks' transfers.
    pub fn moved_bytes(&self) -> u64 {
        self.transfers.iter().map(Transfer::bytes).sum()
    }

    /// K and V bytes the tasks left in place read from earlier CP ranks (0 with CP = 1).
    pub fn in_place_kv_bytes(&self) -> u64 {
        self.servers
            .iter()
            .enumerate()
            .flat_map(|(s, w)| w.tasks.iter().filter(move |t| t.home as usize == s))
            .map(|t| t.kv_bytes)
            .sum()
    }

    /// All bytes the step's core attention moves: moved tasks and in-place KV.
    pub fn bytes(&self) -> u64 {
        self.moved_bytes() + self.in_place_kv_bytes()
    }
}

/// Exact pairs of queries `[lo, hi)` under `mask` (causal: Σ_{q=lo}^{hi−1} (q + 1)).
fn range_pairs(mask: &Mask, lo: u32, hi: u32) -> u64 {
    mask.range_pairs(u64::from(lo), u64::from(hi))
}

/// The largest multiple of `step` in `[k0, max]` that `fits`, where `fits(k0)` holds and
/// `fits` is monotone (true up to some value, false above): one probe past `k0`, then
/// doubling strides and bisection. A `k0` that is already the largest (the causal closed
/// form under the causal mask) costs one probe.
fn largest_fitting(k0: u64, max: u64, step: u64, fits: impl Fn(u64) -> bool) -> u64 {
    let top = max / step;
    let (mut good, mut stride) = (k0 / step, 1u64);
    let mut bad = loop {
        let next = good + stride;
        if next > top {
            break top + 1;
        }
        if !fits(next * step) {
            break next;
        }
        good = next;
        stride *= 2;
    };
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid * step) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good * step
}

/// The contiguous CP layout of one replica's packed sequence: rank c holds positions
/// `[c·per, (c+1)·per)`, per = ⌈max(L, tokens) / CP⌉ (as `plan::build::contiguous_layout`).
#[derive(Clone, Debug)]
struct SeqLayout {
    per: u64,
    /// Start position of each sample.
    starts: Vec<u64>,
}

impl SeqLayout {
    fn new(seq: &PackedSeq, cp: u32) -> SeqLayout {
        let per = u64::from(seq.capacity)
            .max(seq.tokens())
            .div_ceil(u64::from(cp.max(1)))
            .max(1);
        let mut starts = Vec::with_capacity(seq.samples.len());
        let mut at = 0u64;
        for s in &seq.samples {
            starts.push(at);
            at += u64::from(s.len);
        }
        SeqLayout { per, starts }
    }

    /// Sample-local tokens of `[0, x)` of sample starting at `s0` held by rank `c`.
    fn held(&self, c: u32, s0: u64, x: u32) -> u32 {
        let lo = (u64::from(c) * self.per).max(s0);
        let hi = ((u64::from(c) + 1) * self.per).min(s0 + u64::from(x));
        hi.saturating_sub(lo) as u32
    }
}

/// A document's query range held by one server: one of the scheduler's initial ("in
/// place") tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeRange {
    /// The sample.
    pub sample: SampleRef,
    /// Sample-local queries `[lo, hi)` that the server holds.
    pub lo: u32,
    /// One past the last.
    pub hi: u32,
}

impl HomeRange {
    /// Query tokens.
    pub fn tokens(&self) -> u32 {
        self.hi - self.lo
    }
}

/// The initial tasks of every server of `batch` (one packed sequence per replica) on `cp`
/// ranks each: `out[r·CP + c]` lists, in position order, the query ranges of the documents
/// rank `c` of replica `r` holds under the contiguous layout.
pub fn home_ranges(batch: &[PackedSeq], cp: u32) -> Vec<Vec<HomeRange>> {
    let cp = cp.max(1);
    let mut out = vec![Vec::new(); batch.len() * cp as usize];
    for (r, seq) in batch.iter().enumerate() {
        let lay = SeqLayout::new(seq, cp);
        for (j, s) in seq.samples.iter().enumerate() {
            let s0 = lay.starts[j];
            let end = s0 + u64::from(s.len);
            let mut at = s0;
            while at < end {
                let c = at / lay.per;
                let stop = ((c + 1) * lay.per).min(end);
                out[r * cp as usize + c as usize].push(HomeRange {
                    sample: SampleRef {
                        seq: r as u32,
                        index: j as u32,
                    },
                    lo: (at - s0) as u32,
                    hi: (stop - s0) as u32,
                });
                at = stop;
            }
        }
    }
    out
}

/// What is left of a home range on its server: queries `[lo, hi)`.
#[derive(Clone, Copy, Debug)]
struct Item {
    home: u32,
    seq: u32,
    index: u32,
    sample: Sample,
    /// Start position of the sample in its sequence.
    s0: u64,
    lo: u32,
    hi: u32,
    /// The largest block of the item's key prefix held by another server (an earlier CP
    /// rank of the same replica): the most any target can already hold.
    max_held: u32,
}

impl Item {
    fn pairs(&self, mask: &Mask) -> u64 {
        range_pairs(mask, self.lo, self.hi)
    }

    fn sample_ref(&self) -> SampleRef {
        SampleRef {
            seq: self.seq,
            index: self.index,
        }
    }
}

/// What part of an item `[lo, hi)` a move takes.
#[derive(Clone, Copy, Debug)]
enum Shard {
    /// All of it.
    Whole,
    /// `[lo, lo + k)` and `[hi − k, hi)`.
    HeadTail(u32),
    /// `[lo, lo + k)`.
    Head(u32),
}

/// A possible move of (part of) an item.
#[derive(Clone, Copy, Debug)]
struct Move {
    item: usize,
    shard: Shard,
    pairs: u64,
    ratio: f64,
}

/// A multiplicative hash of the scheduler's small integer keys. Its maps are only looked
/// up, never iterated, so the hash cannot reach the schedule.
#[derive(Clone, Copy, Default)]
struct IdHasher(u64);

impl IdHasher {
    fn mix(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.mix(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

struct State<'a> {
    cfg: &'a DistcaConfig,
    /// The mask the loads and key reaches are counted under (`cfg.shape.mask`).
    mask: Mask,
    cp: u32,
    layouts: Vec<SeqLayout>,
    items: Vec<Item>,
    /// Items by server.
    by_server: Vec<Vec<usize>>,
    load: Vec<u64>,
    total: u128,
    servers: u128,
    /// Per server, what [`State::account`] derives from its load: load·P − total
    /// (positive in surplus, negative in deficit: P × the excess), the surplus and
    /// deficit in pairs, and whether it is within tolerance.
    excess: Vec<i128>,
    surplus: Vec<u64>,
    deficit: Vec<u64>,
    within: Vec<bool>,
    /// Servers outside tolerance.
    outside: usize,
    /// Every server by (excess, index): the largest deficits first.
    by_excess: BTreeSet<(i128, usize)>,
    /// Candidates on source servers that can give a move: (whole-move ratio bound,
    /// descending; item).
    candidates: BTreeSet<(Reverse<u64>, usize)>,
    keys: Vec<Option<u64>>,
    /// Per candidate, [`State::smallest_move`]; and their multiset (value → count).
    min_move: Vec<u64>,
    min_moves: BTreeMap<u64, u32>,
    /// Eligible items whose smallest move exceeds what their server may give: no target
    /// can take a move of theirs until they are re-keyed (their server's give changes only
    /// where its items are re-keyed), so they stay out of `candidates`; counted, since
    /// they still hold the phase.
    idle: Vec<bool>,
    idle_count: usize,
    /// 0: coarse items of out-of-tolerance sources only (as far as their fine items cannot
    /// cover the surplus); 1: any item of an out-of-tolerance source; 2: any surplus server.
    phase: u8,
    /// ⌊ε·F̄⌋ in pairs.
    slack: u64,
    /// Per server, Σ exportable pairs of its items ([`State::exportable`]).
    fine: Vec<u64>,
    /// Per (target, sample): keys `[a, d)` of the sample already delivered to the target by
    /// earlier moves of this schedule (it then holds them, as the lowering ships them once:
    /// the hull from the lowest key to the largest query end its units reach; `[0, d)`
    /// under the causal mask).
    delivered: IdMap<(u32, SampleRef), (u32, u32)>,
    /// Per sample, the most keys delivered to any one target, d − a (for the ratio bound).
    delivered_max: IdMap<SampleRef, u32>,
    /// Per sample, its items.
    doc_items: IdMap<SampleRef, Vec<usize>>,
}

impl<'a> State<'a> {
    /// The scheduler's state over `ranges` (see [`schedule_ranges`]), keyed and in the
    /// first phase that has a candidate.
    fn new(
        batch: &[PackedSeq],
        cp: u32,
        ranges: &[Vec<HomeRange>],
        cfg: &'a DistcaConfig,
    ) -> Result<State<'a>> {
        let p = servers_of(batch, cp, ranges.len(), "home range lists")?;
        let layouts: Vec<SeqLayout> = batch.iter().map(|s| SeqLayout::new(s, cp)).collect();
        let (items, by_server, load) = home_items(batch, cp, &layouts, ranges, &cfg.shape.mask)?;
        let total: u128 = load.iter().map(|&l| u128::from(l)).sum();
        let n_items = items.len();
        let mut doc_items: IdMap<SampleRef, Vec<usize>> = IdMap::default();
        for (id, it) in items.iter().enumerate() {
            doc_items.entry(it.sample_ref()).or_default().push(id);
        }
        let mut st = State {
            cfg,
            mask: cfg.shape.mask,
            cp,
            layouts,
            items,
            by_server,
            load,
            total,
            servers: p as u128,
            excess: vec![0; p],
            surplus: vec![0; p],
            deficit: vec![0; p],
            within: vec![true; p],
            outside: 0,
            by_excess: BTreeSet::new(),
            candidates: BTreeSet::new(),
            keys: vec![None; n_items],
            min_move: vec![0; n_items],
            min_moves: BTreeMap::new(),
            idle: vec![false; n_items],
            idle_count: 0,
            phase: 0,
            slack: (cfg.epsilon * total as f64 / p as f64).floor() as u64,
            fine: vec![0; p],
            delivered: IdMap::default(),
            delivered_max: IdMap::default(),
            doc_items,
        };
        for s in 0..p {
            st.account(s);
            st.refine(s);
        }
        st.rekey_all();
        while st.phase < 2 && !st.has_candidates() {
            st.next_phase();
        }
        Ok(st)
    }

    /// Re-derives server `s`'s excess, surplus, deficit and tolerance from its load.
    fn account(&mut self, s: usize) {
        let e = (u128::from(self.load[s]) * self.servers) as i128 - self.total as i128;
        self.by_excess.remove(&(self.excess[s], s));
        self.by_excess.insert((e, s));
        self.excess[s] = e;
        self.surplus[s] = if e > 0 {
            (e as u128 / self.servers) as u64
        } else {
            0
        };
        self.deficit[s] = if e < 0 {
            ((-e) as u128 / self.servers) as u64
        } else {
            0
        };
        let within = (e.unsigned_abs() as f64) <= self.cfg.epsilon * self.total as f64;
        if within != self.within[s] {
            if within {
                self.outside -= 1;
            } else {
                self.outside += 1;
            }
            self.within[s] = within;
        }
    }

    fn surplus(&self, s: usize) -> u64 {
        self.surplus[s]
    }

    fn deficit(&self, s: usize) -> u64 {
        self.deficit[s]
    }

    fn within(&self, s: usize) -> bool {
        self.within[s]
    }

    /// Sample-local keys of `[0, x)` of item `it`'s sample that server `s` holds.
    fn held(&self, s: usize, it: &Item, x: u32) -> u32 {
        let s = s as u32;
        if s / self.cp != it.seq {
            return 0;
        }
        self.layouts[it.seq as usize].held(s % self.cp, it.s0, x)
    }

    /// Keys `[a, x)` of item `it`'s sample that server `s` does not hold (held blocks are
    /// contiguous: the part inside `[a, x)` is held(x) − held(a)).
    fn lacking(&self, s: usize, it: &Item, a: u32, x: u32) -> u32 {
        x - a - (self.held(s, it, x) - self.held(s, it, a))
    }

    /// The keys server `s` must still receive to read `[a, x)` of item `it`'s sample: what
    /// it neither holds nor was delivered by an earlier move. Delivered keys are the hull
    /// `[a', d)` of every reach sent to it (as the lowering ships them), so the cost is the
    /// hull's growth: lacking(hull ∪ [a, x)) − lacking(hull). Under the causal mask
    /// a = a' = 0: the keys of `[d, x)` it does not hold.
    fn missing(&self, s: usize, it: &Item, a: u32, x: u32) -> u32 {
        match self.delivered.get(&(s as u32, it.sample_ref())) {
            None => self.lacking(s, it, a, x),
            Some(&(da, dd)) => {
                self.lacking(s, it, a.min(da), x.max(dd)) - self.lacking(s, it, da, dd)
            }
        }
    }

    /// The lowest key query `q` of item `it`'s sample reaches under the mask.
    fn key_start(&self, q: u32) -> u32 {
        self.mask.key_start(u64::from(q)) as u32
    }

    /// The pairs of item `it` that can leave in moves of at most ⌊ε·F̄⌋ pairs each (what
    /// any target with room can still take): all of it if it is that small, else its
    /// leading whole tiles `[lo, lo + m·tile)` whose one-tile head move each costs ≤ ε·F̄
    /// (tile·q + tile(tile+1)/2 for a tile starting at q). Any move of the item lowers this
    /// by at most the pairs it moves, so a source whose surplus exceeds it by ≤ ε·F̄ can
    /// always get back within tolerance.
    fn exportable(&self, it: &Item) -> u64 {
        let pairs = it.pairs(&self.mask);
        if pairs <= self.slack {
            return pairs;
        }
        let t = u64::from(self.cfg.tile);
        let lo = u64::from(it.lo);
        let tiles = u64::from(it.hi - it.lo) / t;
        // A tile costs at most its causal pairs and at most tile × the mask's most keys per
        // query; both bounds grow (or stay) with its position, so the passing tiles lead.
        let m = if self.mask.max_keys().is_some_and(|k| t * k <= self.slack) {
            tiles
        } else {
            let Some(room) = self.slack.checked_sub(t * (t + 1) / 2) else {
                return 0;
            };
            let qmax = room / t;
            if lo > qmax {
                return 0;
            }
            ((qmax - lo) / t + 1).min(tiles)
        };
        range_pairs(&self.mask, it.lo, it.lo + (m * t) as u32)
    }

    /// Whether item `it` is *coarse*: none of it can leave in moves of ≤ ε·F̄ (its smallest
    /// move, one tile of head or the whole item, costs more than a nearly full target can
    /// still take).
    fn coarse(&self, it: &Item) -> bool {
        it.lo < it.hi && self.exportable(it) == 0
    }

    /// Re-counts server `s`'s fine pairs (exportable in moves of ≤ ε·F̄).
    fn refine(&mut self, s: usize) {
        self.fine[s] = self.by_server[s]
            .iter()
            .map(|&id| self.items[id])
            .filter(|it| it.lo < it.hi)
            .map(|it| self.exportable(&it))
            .sum();
    }

    /// (Q, KV, output) bytes of `q_tokens` queries and `kv_tokens` keys.
    fn bytes(&self, q_tokens: u64, kv_tokens: u32) -> (u64, u64, u64) {
        let sh = &self.cfg.shape;
        let q = sh.q_bytes(q_tokens, sh.heads_q);
        let kv = sh.kv_bytes(u64::from(kv_tokens), sh.heads_kv);
        (q, kv, q)
    }

    fn ratio(&self, pairs: u64, q_tokens: u64, kv_tokens: u32) -> f64 {
        let (q, kv, o) = self.bytes(q_tokens, kv_tokens);
        pairs as f64 / (q + kv + o).max(1) as f64
    }

    /// The ratio of the whole item's move to the most favourable target: an upper bound
    /// of every move of the item (module doc). No target can have more than A = max_held +
    /// (the most keys of the sample delivered to any target) of the prefix; when A ≤ lo the
    /// whole move's ratio with hi − A keys bounds every shard's, else the larger of that
    /// and the ratio of the head `[lo, A)` without KV.
    fn bound(&self, it: &Item) -> f64 {
        let dmax = self
            .delivered_max
            .get(&it.sample_ref())
            .copied()
            .unwrap_or(0);
        // Every shard of the item reads keys from ks = key_start(lo): counted from ks the
        // argument is the causal one (ks = 0 there) wherever a query attends at least the
        // keys of any query before it; under any other mask a shard of t queries keeps at
        // most t·K pairs, K the most keys a query of the item reaches, and moves at least
        // their Q and output.
        let ks = self.key_start(it.lo);
        let reach = it.hi - ks;
        if !self.mask.keys_monotone() {
            let k = self
                .mask
                .max_keys()
                .map_or(reach, |k| k.min(u64::from(reach)) as u32);
            return self.ratio(u64::from(k), 1, 0);
        }
        let avail = it.max_held.saturating_add(dmax).min(reach);
        let n = u64::from(it.hi - it.lo);
        let whole = self.ratio(it.pairs(&self.mask), n, reach - avail);
        if avail > it.lo - ks {
            // the KV-free head [lo, ks + A) and the whole item bound the head shards (ratio
            // of a convex over a positive affine function of k: largest at an end), the
            // whole item bounds the head+tail shards
            let end = ks + avail;
            let head = self.ratio(
                range_pairs(&self.mask, it.lo, end),
                u64::from(end - it.lo),
                0,
            );
            head.max(whole)
        } else {
            whole
        }
    }

    /// Whether server `s`'s items are candidates in the current phase (phase 0 adds the
    /// item's own condition, [`State::eligible`]).
    fn is_source(&self, s: usize) -> bool {
        self.surplus(s) > 0 && (self.phase == 2 || !self.within(s))
    }

    /// The pairs a source may give in the current phase: its surplus; in phase 0 only the
    /// part its fine items cannot cover.
    fn give(&self, s: usize) -> u64 {
        let sur = self.surplus(s);
        if self.phase == 0 {
            sur.saturating_sub(self.fine[s])
        } else {
            sur
        }
    }

    /// Whether item `it` is a candidate in the current phase.
    fn eligible(&self, it: &Item) -> bool {
        let s = it.home as usize;
        it.lo < it.hi
            && self.is_source(s)
            && (self.phase > 0 || (self.coarse(it) && self.give(s) > 0))
    }

    fn set_key(&mut self, id: usize) {
        if let Some(k) = self.keys[id].take() {
            self.candidates.remove(&(Reverse(k), id));
            let m = self.min_move[id];
            if let Some(n) = self.min_moves.get_mut(&m) {
                *n -= 1;
                if *n == 0 {
                    self.min_moves.remove(&m);
                }
            }
        }
        if std::mem::take(&mut self.idle[id]) {
            self.idle_count -= 1;
        }
        let it = self.items[id];
        if self.eligible(&it) {
            let m = self.smallest_move(&it);
            if m > self.give(it.home as usize) {
                self.idle[id] = true;
                self.idle_count += 1;
                return;
            }
            let k = self.bound(&it).to_bits();
            self.candidates.insert((Reverse(k), id));
            self.keys[id] = Some(k);
            self.min_move[id] = m;
            *self.min_moves.entry(m).or_insert(0) += 1;
        }
    }

    /// Whether any item is eligible in the current phase (a candidate or idle).
    fn has_candidates(&self) -> bool {
        !self.candidates.is_empty() || self.idle_count > 0
    }

    /// The pairs of item `it`'s smallest move: one tile of head when the item is longer
    /// than a tile, else the whole item. [`State::evaluate`] finds a move under a cap
    /// exactly when the cap reaches this (pairs only grow with a shard's queries: a
    /// head+tail shard of k costs at least the head of k, and the searches start from a
    /// k that fits).
    fn smallest_move(&self, it: &Item) -> u64 {
        let tile = self.cfg.tile;
        if it.hi - it.lo > tile {
            range_pairs(&self.mask, it.lo, it.lo + tile)
        } else {
            it.pairs(&self.mask)
        }
    }

    /// The move of item `id` to `target` under cap `cap` pairs, if any.
    fn evaluate(&self, id: usize, cap: u64, target: usize) -> Option<Move> {
        let it = &self.items[id];
        let mask = &self.mask;
        let f = it.pairs(mask);
        if f == 0 || cap == 0 {
            return None;
        }
        // keys [key_start(lo), x) the target neither holds nor has received
        let ks = self.key_start(it.lo);
        let kv = |x: u32| self.missing(target, it, ks, x);
        if f <= cap {
            let ratio = self.ratio(f, u64::from(it.hi - it.lo), kv(it.hi));
            return Some(Move {
                item: id,
                shard: Shard::Whole,
                pairs: f,
                ratio,
            });
        }
        let (lo, hi) = (u64::from(it.lo), u64::from(it.hi));
        let tile = u64::from(self.cfg.tile);
        // Head+tail: the largest k in whole tiles whose pairs fit. Causally a head+tail
        // pair of k costs exactly k·a pairs; a mask keeps at most as many, so the causal
        // k is where the search starts. f > cap ≥ pairs(k) ⇒ 2k < hi − lo, so the shard
        // is a proper head+tail pair.
        let a = lo + hi + 1;
        let ht = |k: u64| {
            let k = k as u32;
            range_pairs(mask, it.lo, it.lo + k) + range_pairs(mask, it.hi - k, it.hi)
        };
        let k = largest_fitting((cap / a) / tile * tile, (hi - lo) / 2, tile, |k| {
            ht(k) <= cap
        });
        if k > 0 {
            let pairs = ht(k);
            return Some(Move {
                item: id,
                shard: Shard::HeadTail(k as u32),
                pairs,
                ratio: self.ratio(pairs, 2 * k, kv(it.hi)),
            });
        }
        // Head only: the largest k in whole tiles whose pairs fit (< hi − lo, since the
        // whole item costs more than cap), from the causal k·lo + k(k+1)/2 ≤ cap.
        let causal = |k: u64| k * lo + k * (k + 1) / 2;
        let b = (2 * lo + 1) as f64;
        let mut k = (((b * b + 8.0 * cap as f64).sqrt() - b) / 2.0).max(0.0) as u64;
        while k > 0 && causal(k) > cap {
            k -= 1;
        }
        while causal(k + 1) <= cap {
            k += 1;
        }
        let head = |k: u64| range_pairs(mask, it.lo, it.lo + k as u32);
        let k = largest_fitting(k / tile * tile, hi - lo - 1, tile, |k| head(k) <= cap);
        if k == 0 {
            return None;
        }
        let pairs = head(k);
        Some(Move {
            item: id,
            shard: Shard::Head(k as u32),
            pairs,
            ratio: self.ratio(pairs, k, kv(it.lo + k as u32)),
        })
    }

    fn better(best: &Option<Move>, m: &Move) -> bool {
        best.is_none_or(|b| m.ratio > b.ratio || (m.ratio == b.ratio && m.item < b.item))
    }

    /// The best move into `target` from the current candidates. Items are visited by their
    /// ratio bound, an upper bound of any move of theirs, so the scan stops as soon as
    /// that bound cannot beat the best move found.
    /// `over`: how far above F̄ the target may end (0, or the fallback's ε·F̄).
    /// A candidate's smallest move fits what its server may give, so it gives a move
    /// exactly when that also fits the deficit: the others are skipped unevaluated, and
    /// none is visited when the deficit is below every candidate's smallest move.
    fn best_move(&self, target: usize, over: u64) -> Option<Move> {
        let deficit = self.deficit(target) + over;
        if self
            .min_moves
            .first_key_value()
            .is_none_or(|(&m, _)| deficit < m)
        {
            return None;
        }
        let mut best: Option<Move> = None;
        for &(Reverse(ub), id) in &self.candidates {
            if best.is_some_and(|b| f64::from_bits(ub) <= b.ratio) {
                break;
            }
            if deficit < self.min_move[id] {
                continue;
            }
            let cap = deficit.min(self.give(self.items[id].home as usize));
            if let Some(m) = self.evaluate(id, cap, target) {
                if Self::better(&best, &m) {
                    best = Some(m);
                }
            }
        }
        best
    }

    /// Re-keys every item (after a phase change).
    fn rekey_all(&mut self) {
        for id in 0..self.items.len() {
            self.set_key(id);
        }
    }

    /// Next phase: re-keys every item; false when already in the last.
    fn next_phase(&mut self) -> bool {
        if self.phase >= 2 {
            return false;
        }
        self.phase += 1;
        self.rekey_all();
        true
    }

    /// The next target: the largest deficit of a server not `stuck`, lowest index on a
    /// tie; none when no such server lacks a whole pair.
    fn pick_target(&self, stuck: &[bool]) -> Option<usize> {
        // deficit = ⌊−excess / P⌋ is monotone in −excess: the first server not stuck in
        // excess order has the largest −excess; the target is the lowest index whose
        // −excess reaches that deficit's floor.
        let mut free = self
            .by_excess
            .iter()
            .filter(|&&(_, s)| !stuck[s])
            .peekable();
        let top = -free.peek()?.0;
        if top < self.servers as i128 {
            return None;
        }
        let floor = (top as u128 / self.servers * self.servers) as i128;
        free.take_while(|&&(e, _)| -e >= floor)
            .map(|&(_, s)| s)
            .min()
    }

    /// The move into `target`: the best that fits its deficit, else (skewsim's extension)
    /// one that leaves it within tolerance above F̄, else in phase 0 one that also takes
    /// the room of the target's own fine items, which it then gives away in phase 1 as an
    /// out-of-tolerance source.
    fn find_move(&self, target: usize) -> Option<Move> {
        self.best_move(target, 0)
            .or_else(|| match self.slack {
                0 => None,
                over => self.best_move(target, over),
            })
            .or_else(|| match (self.phase, self.fine[target]) {
                (0, f) if f > 0 => self.best_move(target, self.slack + f),
                _ => None,
            })
    }

    /// Makes move `m` into `target`: shrinks the item, shifts the load, records the keys
    /// delivered and re-keys what changed; returns the moved task and its transfer.
    fn apply(&mut self, m: Move, target: usize) -> (AttnTask, Transfer) {
        let it = self.items[m.item];
        let home = it.home as usize;
        let q_ranges = match m.shard {
            Shard::Whole => {
                self.items[m.item].lo = it.hi;
                vec![(it.lo, it.hi)]
            }
            Shard::HeadTail(k) => {
                self.items[m.item].lo = it.lo + k;
                self.items[m.item].hi = it.hi - k;
                vec![(it.lo, it.lo + k), (it.hi - k, it.hi)]
            }
            Shard::Head(k) => {
                self.items[m.item].lo = it.lo + k;
                vec![(it.lo, it.lo + k)]
            }
        };
        let kv_prefix = q_ranges.last().map_or(it.hi, |r| r.1);
        let q_tokens: u64 = q_ranges.iter().map(|&(a, b)| u64::from(b - a)).sum();
        self.load[home] -= m.pairs;
        self.load[target] += m.pairs;
        self.account(home);
        self.account(target);
        // KV charged once per (target, sample): only the part of the reach still missing.
        let ks = self.key_start(it.lo);
        let kv_tokens = self.missing(target, &it, ks, kv_prefix);
        let doc = it.sample_ref();
        let d = self
            .delivered
            .entry((target as u32, doc))
            .or_insert((ks, kv_prefix));
        *d = (d.0.min(ks), d.1.max(kv_prefix));
        let len = d.1 - d.0;
        let dmax = self.delivered_max.entry(doc).or_insert(0);
        if len > *dmax {
            *dmax = len;
            if let Some(ids) = self.doc_items.get(&doc).cloned() {
                for id in ids {
                    self.set_key(id);
                }
            }
        }
        self.refine(home);
        for id in self.by_server[home].clone() {
            self.set_key(id);
        }
        let cfg = self.cfg;
        let (q_bytes, kv_bytes, out_bytes) = self.bytes(q_tokens, kv_tokens);
        let task = AttnTask {
            sample: doc,
            home: it.home,
            of: it.sample,
            q_ranges,
            kv_prefix,
            kv_bytes,
            pairs: m.pairs,
            flops: cfg.shape.fwd_flops(m.pairs, cfg.shape.heads_q),
        };
        let transfer = Transfer {
            src: it.home,
            dst: target as u32,
            task: 0,
            q_bytes,
            kv_bytes,
            out_bytes,
        };
        (task, transfer)
    }

    /// The schedule: per server, what is left of its items in place (reading the prefix
    /// earlier ranks hold) followed by the tasks it received, in the order received.
    fn into_schedule(self, received: Vec<Vec<(AttnTask, Transfer)>>, stop: Stop) -> DistcaSchedule {
        let cfg = self.cfg;
        let p = self.load.len();
        let mut out_servers = Vec::with_capacity(p);
        let mut transfers = Vec::new();
        for (s, got) in received.into_iter().enumerate() {
            let mut tasks: Vec<AttnTask> = self.by_server[s]
                .iter()
                .map(|&id| self.items[id])
                .filter(|it| it.lo < it.hi)
                .map(|it| {
                    let pairs = it.pairs(&self.mask);
                    let remote = self.lacking(s, &it, self.key_start(it.lo), it.hi);
                    AttnTask {
                        sample: it.sample_ref(),
                        home: it.home,
                        of: it.sample,
                        q_ranges: vec![(it.lo, it.hi)],
                        kv_prefix: it.hi,
                        kv_bytes: self.bytes(0, remote).1,
                        pairs,
                        flops: cfg.shape.fwd_flops(pairs, cfg.shape.heads_q),
                    }
                })
                .collect();
            for (task, mut t) in got {
                t.task = tasks.len();
                tasks.push(task);
                transfers.push(t);
            }
            let pairs: u64 = tasks.iter().map(|t| t.pairs).sum();
            out_servers.push(ServerWork {
                tasks,
                pairs,
                flops: cfg.shape.fwd_flops(pairs, cfg.shape.heads_q),
            });
        }
        DistcaSchedule {
            servers: out_servers,
            transfers,
            ideal_flops: cfg.shape.fwd_flops(1, cfg.shape.heads_q) * self.total as f64 / p as f64,
            epsilon: cfg.epsilon,
            cp: self.cp,
            stop,
        }
    }
}

/// Schedules the core attention of one batch with CP = 1: `batch[s]` is server `s`'s
/// micro-batch, held whole.
pub fn schedule(batch: &[PackedSeq], cfg: &DistcaConfig) -> Result<DistcaSchedule> {
    schedule_cp(batch, 1, cfg)
}

/// Schedules the core attention of one GA index: `batch[r]` is replica `r`'s micro-batch,
/// laid out over its `cp` ranks (servers `r·CP … r·CP + CP − 1`).
pub fn schedule_cp(batch: &[PackedSeq], cp: u32, cfg: &DistcaConfig) -> Result<DistcaSchedule> {
    let ranges = home_ranges(batch, cp.max(1));
    schedule_ranges(batch, cp, &ranges, cfg)
}

/// The number of servers DP·CP of `batch` on `cp` ranks, checked against `lists` per-server
/// lists (`what` names them): errors for CP of 0, no server or another count.
fn servers_of(batch: &[PackedSeq], cp: u32, lists: usize, what: &str) -> Result<usize> {
    if cp == 0 {
        return Err(invalid("cp", cp, "at least 1 rank per replica"));
    }
    let p = batch.len() * cp as usize;
    if p == 0 {
        return Err(invalid("servers", 0, "at least one attention server"));
    }
    if lists != p {
        return Err(invalid(what, lists, format!("one per server: DP·CP = {p}")));
    }
    Ok(p)
}

/// The items of per-server home-range lists, the items of each server and each server's
/// load, after checking every range against the batch and the contiguous layout.
type HomeItems = (Vec<Item>, Vec<Vec<usize>>, Vec<u64>);

fn home_items(
    batch: &[PackedSeq],
    cp: u32,
    layouts: &[SeqLayout],
    ranges: &[Vec<HomeRange>],
    mask: &Mask,
) -> Result<HomeItems> {
    let mut items = Vec::new();
    let mut by_server = vec![Vec::new(); ranges.len()];
    let mut load = vec![0u64; ranges.len()];
    for (s, list) in ranges.iter().enumerate() {
        for hr in list {
            let (r, j) = (hr.sample.seq as usize, hr.sample.index as usize);
            let sample = batch.get(r).and_then(|q| q.samples.get(j)).copied();
            let Some(sample) = sample.filter(|x| hr.lo < hr.hi && hr.hi <= x.len) else {
                return Err(invalid(
                    format!("server {s} home range"),
                    format!("{:?}", hr),
                    "a non-empty query range inside a sample of the batch",
                ));
            };
            let lay = &layouts[r];
            let s0 = lay.starts[j];
            let c = (s % cp as usize) as u32;
            if s / cp as usize != r
                || lay.held(c, s0 + u64::from(hr.lo), hr.hi - hr.lo) != hr.hi - hr.lo
            {
                return Err(invalid(
                    format!("server {s} home range"),
                    format!("{:?}", hr),
                    "queries the server holds under the contiguous CP layout",
                ));
            }
            // Blocks of earlier ranks lie inside [0, lo); later ranks hold nothing below hi.
            let max_held = (0..c).map(|c2| lay.held(c2, s0, hr.lo)).max().unwrap_or(0);
            let it = Item {
                home: s as u32,
                seq: r as u32,
                index: j as u32,
                sample,
                s0,
                lo: hr.lo,
                hi: hr.hi,
                max_held,
            };
            load[s] += it.pairs(mask);
            by_server[s].push(items.len());
            items.push(it);
        }
    }
    Ok((items, by_server, load))
}

/// Schedules per-server lists of home ranges (a subset of [`home_ranges`]`(batch, cp)`,
/// e.g. one nano-batch). Errors: no server, CP of 0, a list per server other than
/// `batch.len()·cp`, or a range that is empty, outside its sample or not held by its server.
pub fn schedule_ranges(
    batch: &[PackedSeq],
    cp: u32,
    ranges: &[Vec<HomeRange>],
    cfg: &DistcaConfig,
) -> Result<DistcaSchedule> {
    let mut st = State::new(batch, cp, ranges, cfg)?;
    let p = st.load.len();
    let mut received: Vec<Vec<(AttnTask, Transfer)>> = vec![Vec::new(); p];
    let mut stuck = vec![false; p];
    let stop = loop {
        if st.outside == 0 {
            break Stop::Balanced;
        }
        let Some(target) = st.pick_target(&stuck) else {
            // The current sources cannot help any target any more: widen them (phase 1:
            // every item of an out-of-tolerance source; phase 2: every surplus server).
            if !st.next_phase() {
                break Stop::NoMoveHelps;
            }
            stuck.fill(false);
            continue;
        };
        let Some(m) = st.find_move(target) else {
            stuck[target] = true;
            continue;
        };
        received[target].push(st.apply(m, target));
        while st.phase < 2 && !st.has_candidates() {
            // No candidate left in this phase: the next (see the loop's head).
            st.next_phase();
            stuck.fill(false);
        }
    };
    Ok(st.into_schedule(received, stop))
}

/// The two nano-batches of one server's home ranges (module doc): heaviest (pairs under
/// `mask`) first onto the half with fewer pairs (half 0 on a tie; ties in pairs by
/// position), each half in position order.
pub fn nano_split(ranges: &[HomeRange], mask: &Mask) -> [Vec<HomeRange>; 2] {
    nano_split_pinned(ranges, mask, false, false)
}

/// [`nano_split`] with two pins placed before the rest: the first range into half 1 when
/// `first_in_one` (it continues a document whose piece on the previous rank is in
/// nano-batch 1), the last range (another one) into half 0 when `last_in_zero` (it
/// continues onto the next rank, which then stays free).
pub fn nano_split_pinned(
    ranges: &[HomeRange],
    mask: &Mask,
    first_in_one: bool,
    last_in_zero: bool,
) -> [Vec<HomeRange>; 2] {
    let n = ranges.len();
    let pairs: Vec<u64> = ranges
        .iter()
        .map(|r| range_pairs(mask, r.lo, r.hi))
        .collect();
    let pin = |i: usize| match i {
        0 if first_in_one => Some(1),
        i if last_in_zero && i + 1 == n => Some(0),
        _ => None,
    };
    halves_by_pairs(&pairs, pin).map(|h| h.into_iter().map(|i| ranges[i]).collect())
}

/// Indices `0..pairs.len()` in two halves: each pinned index (`pin(i)`: its half) first,
/// then the rest heaviest (`pairs[i]`) first onto the half with fewer pairs (half 0 on a
/// tie; equal pairs by index), each half ascending.
fn halves_by_pairs(pairs: &[u64], pin: impl Fn(usize) -> Option<usize>) -> [Vec<usize>; 2] {
    let mut halves: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    let mut load = [0u64; 2];
    let mut free = Vec::with_capacity(pairs.len());
    for (i, &p) in pairs.iter().enumerate() {
        match pin(i) {
            Some(h) => {
                load[h.min(1)] += p;
                halves[h.min(1)].push(i);
            }
            None => free.push(i),
        }
    }
    free.sort_by_key(|&i| (Reverse(pairs[i]), i));
    for i in free {
        let h = usize::from(load[1] < load[0]);
        load[h] += pairs[i];
        halves[h].push(i);
    }
    halves.map(|mut h| {
        h.sort_unstable();
        h
    })
}

/// The nano-batch split of every server of `batch` on `cp` ranks (module doc): per rank
/// [`nano_split_pinned`], ranks of a replica in order; a range that continues a document
/// from the previous rank goes to nano-batch 1 when that piece is in nano-batch 1, and a
/// range that continues onto the next rank goes to nano-batch 0 — so along every document
/// the nano-batch never decreases (a nano-batch-0 task never reads keys of nano-batch-1
/// tokens), and a long document's pieces stay in nano-batch 0 instead of dragging the
/// ranks after them into nano-batch 1.
pub fn nano_splits(batch: &[PackedSeq], cp: u32, mask: &Mask) -> Vec<[Vec<HomeRange>; 2]> {
    let cp = cp.max(1) as usize;
    let hr = home_ranges(batch, cp as u32);
    let mut out: Vec<[Vec<HomeRange>; 2]> = Vec::with_capacity(hr.len());
    for (s, ranges) in hr.iter().enumerate() {
        let cont = ranges.first().is_some_and(|f| f.lo > 0);
        let prev_in_one = cont
            && s % cp != 0
            && out.last().is_some_and(|p: &[Vec<HomeRange>; 2]| {
                p[1].last().is_some_and(|l| l.sample == ranges[0].sample)
            });
        let continues = ranges.last().is_some_and(|l| {
            let seq = &batch[l.sample.seq as usize];
            l.hi < seq.samples[l.sample.index as usize].len
        });
        out.push(nano_split_pinned(ranges, mask, prev_in_one, continues));
    }
    out
}

/// One nano-batch: which home ranges of each server it holds, and its schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NanoBatch {
    /// Per server, its home ranges in this nano-batch.
    pub ranges: Vec<Vec<HomeRange>>,
    /// The core-attention schedule of this nano-batch over all servers.
    pub schedule: DistcaSchedule,
}

/// Ping-pong with CP = 1 ([`schedule_ping_pong_cp`]).
pub fn schedule_ping_pong(batch: &[PackedSeq], cfg: &DistcaConfig) -> Result<[NanoBatch; 2]> {
    schedule_ping_pong_cp(batch, 1, cfg)
}

/// Ping-pong: every server's home ranges split into two nano-batches ([`nano_split`]),
/// each scheduled over all servers. The engine runs nano-batch 0's transfers while
/// nano-batch 1 computes, and the other way round.
pub fn schedule_ping_pong_cp(
    batch: &[PackedSeq],
    cp: u32,
    cfg: &DistcaConfig,
) -> Result<[NanoBatch; 2]> {
    if cp == 0 {
        return Err(invalid("cp", cp, "at least 1 rank per replica"));
    }
    let splits = nano_splits(batch, cp, &cfg.shape.mask);
    let nano = |h: usize| -> Result<NanoBatch> {
        let ranges: Vec<Vec<HomeRange>> = splits.iter().map(|s| s[h].clone()).collect();
        Ok(NanoBatch {
            schedule: schedule_ranges(batch, cp, &ranges, cfg)?,
            ranges,
        })
    };
    Ok([nano(0)?, nano(1)?])
}

/// One GA index's schedule (no ping-pong) by `cfg.scheduler`: [`reference::schedule`] or
/// [`schedule_cp`].
pub fn schedule_step(batch: &[PackedSeq], cp: u32, cfg: &DistcaConfig) -> Result<DistcaSchedule> {
    match cfg.scheduler {
        DistcaScheduler::Reference => reference::schedule(batch, cp, cfg),
        DistcaScheduler::Tight => schedule_cp(batch, cp, cfg),
    }
}

/// One GA index's two nano-batch schedules by `cfg.scheduler`:
/// [`reference::schedule_ping_pong`] or [`schedule_ping_pong_cp`].
pub fn schedule_nanos(
    batch: &[PackedSeq],
    cp: u32,
    cfg: &DistcaConfig,
) -> Result<[DistcaSchedule; 2]> {
    match cfg.scheduler {
        DistcaScheduler::Reference => reference::schedule_ping_pong(batch, cp, cfg),
        DistcaScheduler::Tight => Ok(schedule_ping_pong_cp(batch, cp, cfg)?.map(|n| n.schedule)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::ulysses::cp_group;
    use crate::plan::build::contiguous_layout;
    use crate::workload::causal_pairs;
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};
    use proptest::prelude::*;

    /// 1 head, head_dim 1, 1 byte: FLOPs = 4·pairs; Q = out = tokens bytes, KV = 2·tokens.
    pub(super) fn unit() -> AttnShape {
        AttnShape {
            heads_q: 1,
            heads_kv: 1,
            head_dim: 1,
            dtype_bytes: 1,
            mask: crate::cost::Mask::Causal,
        }
    }

    fn cfg(eps: f64, tile: u32) -> DistcaConfig {
        DistcaConfig::new(unit(), eps, tile)
            .unwrap()
            .with_scheduler(DistcaScheduler::Tight)
    }

    fn seq(lens: &[u32], doc0: u64) -> PackedSeq {
        PackedSeq::from_lengths(lens, lens.iter().sum::<u32>().max(1), doc0)
    }

    /// Sample-local keys `[0, x)` of sample `j` of replica `r` held by server `w`, from
    /// `plan::build::contiguous_layout` (independent of the scheduler's own arithmetic).
    fn held_by(batch: &[PackedSeq], cp: u32, r: usize, j: usize, x: u32, w: u32) -> u64 {
        let seq = &batch[r];
        let lay = contiguous_layout(seq.tokens(), seq.capacity, &cp_group(r as u32, cp));
        let s0: u64 = seq.samples[..j].iter().map(|x| u64::from(x.len)).sum();
        let (a, e) = (s0, s0 + u64::from(x));
        lay.iter()
            .filter(|p| p.worker == w)
            .map(|p| p.end.min(e).saturating_sub(p.start.max(a)))
            .sum()
    }

    /// Every query token of every sample attended exactly once, task pairs exact under the
    /// shape's mask, KV prefix = the last query + 1, queries held by the task's home, KV
    /// bytes = the keys the mask reaches, [key_start(first query), prefix), that the
    /// executing server does not hold (for moved tasks: once per (server, sample), the hull
    /// of their reaches), loads and the FLOP total exact; transfers match moved tasks.
    fn check_conservation(batch: &[PackedSeq], cp: u32, s: &DistcaSchedule, shape: &AttnShape) {
        let mask = shape.mask;
        let lacking = |r: usize, j: usize, a: u32, x: u32, w: u32| {
            u64::from(x - a) - (held_by(batch, cp, r, j, x, w) - held_by(batch, cp, r, j, a, w))
        };
        assert_eq!(s.servers.len(), batch.len() * cp as usize);
        assert_eq!(s.cp, cp);
        let mut hit: Vec<Vec<Vec<u8>>> = batch
            .iter()
            .map(|q| q.samples.iter().map(|x| vec![0; x.len as usize]).collect())
            .collect();
        let mut total = 0u64;
        for (dst, w) in s.servers.iter().enumerate() {
            let mut load = 0;
            let mut moved_kv: std::collections::BTreeMap<(usize, usize), (u32, u32, u64)> =
                Default::default();
            for t in &w.tasks {
                let (r, j) = (t.sample.seq as usize, t.sample.index as usize);
                let mut pairs = 0;
                for &(lo, hi) in &t.q_ranges {
                    assert!(lo < hi);
                    pairs += range_pairs(&mask, lo, hi);
                    for q in lo..hi {
                        hit[r][j][q as usize] += 1;
                    }
                    // the home holds these queries
                    let on_home =
                        held_by(batch, cp, r, j, hi, t.home) - held_by(batch, cp, r, j, lo, t.home);
                    assert_eq!(on_home, u64::from(hi - lo), "{t:?}");
                }
                assert_eq!(t.pairs, pairs);
                assert_eq!(t.kv_prefix, t.q_ranges.last().unwrap().1);
                assert_eq!(t.flops, shape.fwd_flops(t.pairs, shape.heads_q));
                assert_eq!(t.of, batch[r].samples[j]);
                let ks = mask.key_start(u64::from(t.q_ranges[0].0)) as u32;
                let remote = lacking(r, j, ks, t.kv_prefix, dst as u32);
                let full = shape.kv_bytes(remote, shape.heads_kv);
                if t.home as usize == dst {
                    assert_eq!(t.kv_bytes, full, "{t:?}");
                } else {
                    let e = moved_kv.entry((r, j)).or_insert((ks, 0, 0));
                    e.0 = e.0.min(ks);
                    e.1 = e.1.max(t.kv_prefix);
                    e.2 += t.kv_bytes;
                }
                load += t.pairs;
            }
            // Moved tasks of one sample on one server pay, together, exactly the keys of the
            // hull of their reaches (the longest prefix, causal) the server does not hold.
            for (&(r, j), &(a, prefix, bytes)) in &moved_kv {
                let remote = lacking(r, j, a, prefix, dst as u32);
                assert_eq!(
                    bytes,
                    shape.kv_bytes(remote, shape.heads_kv),
                    "{dst} {r} {j}"
                );
            }
            assert_eq!(w.pairs, load);
            total += load;
            let moved_in = w.tasks.iter().filter(|t| t.home as usize != dst).count();
            let transfers_in = s.transfers.iter().filter(|t| t.dst as usize == dst).count();
            assert_eq!(moved_in, transfers_in);
        }
        assert!(hit.iter().flatten().flatten().all(|&h| h == 1));
        let exact: u64 = batch
            .iter()
            .flat_map(|q| &q.samples)
            .map(|x| mask.pairs(u64::from(x.len)))
            .sum();
        assert_eq!(total, exact);
        let flops: f64 = s.servers.iter().map(|w| w.flops).sum();
        let want = shape.fwd_flops(exact, shape.heads_q);
        assert!((flops - want).abs() <= 1e-9 * want);
        for t in &s.transfers {
            let task = &s.servers[t.dst as usize].tasks[t.task];
            assert_eq!(task.home, t.src);
            assert_ne!(t.src, t.dst);
            let q: u64 = task.q_ranges.iter().map(|&(a, b)| u64::from(b - a)).sum();
            assert_eq!(t.q_bytes, shape.q_bytes(q, shape.heads_q));
            assert_eq!(t.out_bytes, t.q_bytes);
            assert_eq!(t.kv_bytes, task.kv_bytes);
        }
        let in_place: u64 = s
            .servers
            .iter()
            .enumerate()
            .flat_map(|(i, w)| w.tasks.iter().filter(move |t| t.home as usize == i))
            .map(|t| t.kv_bytes)
            .sum();
        assert_eq!(s.bytes(), s.moved_bytes() + in_place);
        if cp == 1 {
            assert_eq!(in_place, 0);
        }
    }

    #[test]
    fn two_servers_by_hand_whole_move() {
        // Server 0: samples 4 and 2 (10 + 3 = 13 pairs); server 1: sample 1 (1 pair).
        // F̄ = 7. Surplus 6, deficit 6. Candidates: the 4 (10 pairs > 6 → shard: a = 5,
        // k = ⌊6/5⌋ = 1 with tile 1 → 5 pairs, bytes 2·2 + 2·4 = 12, ratio 5/12) and the 2
        // (3 pairs ≤ 6, whole: bytes 2·2 + 2·2 = 8, ratio 3/8). 5/12 > 3/8: the shard
        // [0,1)+[3,4) of the 4 moves: server 0 = 8, server 1 = 6: |8 − 7| = 1 ≤ ε·7 for
        // ε = 0.15 → Balanced. With ε = 0.1 it is not (1 > 0.7), and deficit 1 = surplus 1:
        // the 4's middle [1,3) costs 5 > 1, no pair (a = 5), no head (1 + 1 > 1); the 2
        // costs 3 > 1, no pair (a = 3), but its head [0,1) costs 1 → moves: 7 and 7.
        let batch = [seq(&[4, 2], 0), seq(&[1], 10)];
        let s = schedule(&batch, &cfg(0.15, 1)).unwrap();
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!(s.servers[0].pairs, 8);
        assert_eq!(s.servers[1].pairs, 6);
        assert_eq!(s.transfers.len(), 1);
        let t = &s.servers[1].tasks[s.transfers[0].task];
        assert_eq!(t.q_ranges, vec![(0, 1), (3, 4)]);
        assert_eq!(t.kv_prefix, 4);
        assert_eq!(s.transfers[0].bytes(), 12);
        check_conservation(&batch, 1, &s, &unit());
        // With ε = 0.1 (0.7 < 1) the same state is out of tolerance and stuck.
        let s = schedule(&batch, &cfg(0.1, 1)).unwrap();
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!((s.servers[0].pairs, s.servers[1].pairs), (7, 7));
        let t = &s.servers[1].tasks[s.transfers[1].task];
        assert_eq!(
            (t.of.len, t.q_ranges.clone(), t.kv_prefix),
            (2, vec![(0, 1)], 1)
        );
        check_conservation(&batch, 1, &s, &unit());
    }

    #[test]
    fn head_tail_shard_in_tiles_by_hand() {
        // Server 0: one 1024-token sample (524800 pairs); server 1: empty. F̄ = 262400.
        // cap = 262400, a = 1025, ⌊cap/a⌋ = 256 → k = 256 (2 tiles): 262400 pairs — the
        // head+tail pair of 256 + 256 tokens carries exactly half the causal cost.
        let batch = [seq(&[1024], 0), seq(&[], 5)];
        let s = schedule(&batch, &cfg(0.0, 128)).unwrap();
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!(s.servers[0].pairs, 262_400);
        assert_eq!(s.servers[1].pairs, 262_400);
        assert_eq!(s.servers[0].tasks[0].q_ranges, vec![(256, 768)]);
        assert_eq!(s.servers[0].tasks[0].kv_prefix, 768);
        let moved = &s.servers[1].tasks[0];
        assert_eq!(moved.q_ranges, vec![(0, 256), (768, 1024)]);
        assert_eq!(moved.kv_prefix, 1024);
        // bytes: Q 512, out 512, KV 2·1024.
        assert_eq!(s.transfers[0].bytes(), 512 + 512 + 2048);
        check_conservation(&batch, 1, &s, &unit());
        // Tile 384: the pair's k = 256 rounds to 0; head only: k(k+1)/2 ≤ 262400 → k = 723
        // → 384: [0, 384), 73920 pairs. Then [384, 1024) and deficit 188480: pair a = 1409,
        // k = 133 → 0; head: 384k + k(k+1)/2 ≤ 188480 → k = 339 → 0. Stuck → NoMoveHelps.
        let s = schedule(&batch, &cfg(0.0, 384)).unwrap();
        assert_eq!(s.stop, Stop::NoMoveHelps);
        assert_eq!(s.transfers.len(), 1);
        assert_eq!(s.servers[1].tasks[0].q_ranges, vec![(0, 384)]);
        assert_eq!(s.servers[1].tasks[0].kv_prefix, 384);
        assert_eq!(s.servers[1].pairs, 73_920);
        assert_eq!(s.servers[0].tasks[0].q_ranges, vec![(384, 1024)]);
        // bytes: Q 384, out 384, KV of the 384-token prefix only: 768.
        assert_eq!(s.transfers[0].bytes(), 384 + 384 + 768);
        check_conservation(&batch, 1, &s, &unit());
    }

    #[test]
    fn prefers_flops_per_byte() {
        // Server 0: a 512 (131328 pairs) and 16 × 32 (528 each): 139776. Server 1: 8 × 128
        // (8256 each): 66048. F̄ = 102912, surplus = deficit = 36864.
        // A 32 moves whole at 528 / (32 + 32 + 2·32) = 4.125 pairs per byte; the 512's shard
        // (a = 513, k = ⌊36864/513⌋ = 71 → 64 in tiles of 16) moves 32832 pairs for
        // 128 + 128 + 2·512 bytes = 25.65 per byte → it wins. Then 106944 vs 98880:
        // 4032 / 102912 = 3.9% ≤ 5% → Balanced after one move.
        let mut lens = vec![512u32];
        lens.extend([32u32; 16]);
        let batch = [seq(&lens, 0), seq(&[128; 8], 100)];
        let s = schedule(&batch, &cfg(0.05, 16)).unwrap();
        check_conservation(&batch, 1, &s, &unit());
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!(s.transfers.len(), 1);
        let task = &s.servers[1].tasks[s.transfers[0].task];
        assert_eq!(task.of.len, 512);
        assert_eq!(task.q_ranges, vec![(0, 64), (448, 512)]);
        assert_eq!(task.pairs, 32_832);
        assert_eq!(s.servers[0].pairs, 106_944);
    }

    #[test]
    fn within_tolerance_moves_nothing() {
        // Loads 57 (10, 1, 1) and 47 (9, 1, 1): F̄ = 52, deviation 5/52 = 9.6%.
        let batch = [seq(&[10, 1, 1], 0), seq(&[9, 1, 1], 5)];
        let s = schedule(&batch, &cfg(0.10, 1)).unwrap();
        assert_eq!(s.stop, Stop::Balanced);
        assert!(s.transfers.is_empty());
        // ε = 0.05: deficit 5. A 1-token sample moves whole at 1 / (1 + 1 + 2) = 0.25 pairs
        // per byte; the 10 has no pair (a = 11 > 5) but a head [0,2) of 3 pairs at
        // 3 / (2 + 2 + 4) = 0.375 → it moves: 54 / 50, 2/52 = 3.8% → Balanced.
        let s = schedule(&batch, &cfg(0.05, 1)).unwrap();
        assert_eq!(s.transfers.len(), 1);
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!((s.servers[0].pairs, s.servers[1].pairs), (54, 50));
        assert_eq!(s.servers[1].tasks[3].q_ranges, vec![(0, 2)]);
        check_conservation(&batch, 1, &s, &unit());
    }

    #[test]
    fn corpus_batch_is_balanced_conserved_and_deterministic() {
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let batch = global_batch(&corpus, 65_536, 32, Packing::Sequential, 7, 0).unwrap();
        let shape = AttnShape {
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let c = DistcaConfig::new(shape, DEFAULT_EPSILON, 128).unwrap();
        let s = schedule(&batch, &c).unwrap();
        check_conservation(&batch, 1, &s, &shape);
        assert_eq!(s.stop, Stop::Balanced);
        assert!(s.max_deviation() <= DEFAULT_EPSILON + 1e-12);
        // The packed batch was not balanced to begin with.
        let loads: Vec<u64> = batch.iter().map(PackedSeq::causal_pairs).collect();
        let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
        let dev = loads
            .iter()
            .map(|&l| (l as f64 - mean).abs() / mean)
            .fold(0.0, f64::max);
        assert!(dev > DEFAULT_EPSILON);
        assert!(!s.transfers.is_empty());
        assert_eq!(s, schedule(&batch, &c).unwrap());
        // A tolerance above every deviation needs no move at all.
        let loose = schedule(&batch, &DistcaConfig::new(shape, 10.0, 128).unwrap()).unwrap();
        assert!(loose.transfers.is_empty());
        // Tighter tolerance: still conserved, within its ε when Balanced.
        let tight = schedule(&batch, &DistcaConfig::new(shape, 0.02, 128).unwrap()).unwrap();
        check_conservation(&batch, 1, &tight, &shape);
        if tight.stop == Stop::Balanced {
            assert!(tight.max_deviation() <= 0.02 + 1e-12);
        }
    }

    #[test]
    fn balances_corpus_batches_across_seeds_and_corpora() {
        let shape = AttnShape {
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let c = DistcaConfig::new(shape, DEFAULT_EPSILON, 128).unwrap();
        for (corpus, l) in [("wlbllm", 131_072), ("libra-256k", 262_144)] {
            let corpus = Corpus::from_spec(corpus).unwrap();
            for seed in 0..4 {
                let batch = global_batch(&corpus, l, 64, Packing::Sequential, seed, 0).unwrap();
                let s = schedule(&batch, &c).unwrap();
                check_conservation(&batch, 1, &s, &shape);
                assert_eq!(s.stop, Stop::Balanced, "seed {seed}");
                assert!(s.max_deviation() <= DEFAULT_EPSILON + 1e-12);
            }
        }
    }

    /// Sample indices of a server's home ranges (whole samples with CP = 1).
    fn idx(r: &[HomeRange]) -> Vec<u32> {
        r.iter().map(|h| h.sample.index).collect()
    }

    #[test]
    fn ping_pong_splits_by_pairs_and_conserves() {
        let b = seq(&[100, 60, 50, 30, 20, 70], 0);
        // pairs 5050, 1830, 1275, 465, 210, 2485; heaviest first onto the lighter half:
        // 100→0, 70→1, 60→1 (4315), 50→1 (5590), 30→0 (5515), 20→0 (5725).
        // (By tokens it would be 100→0, 70→1, 60→1, 50→0, 30→1, 20→0.)
        let hr = &home_ranges(std::slice::from_ref(&b), 1)[0];
        let [h0, h1] = nano_split(hr, &Mask::Causal);
        assert_eq!((idx(&h0), idx(&h1)), (vec![0, 3, 4], vec![1, 2, 5]));
        let batch = [b, seq(&[300, 10], 9)];
        let [ping, pong] = schedule_ping_pong(&batch, &cfg(0.1, 16)).unwrap();
        assert_eq!(
            ping.ranges.iter().map(|r| idx(r)).collect::<Vec<_>>(),
            vec![vec![0, 3, 4], vec![0]]
        );
        assert_eq!(
            pong.ranges.iter().map(|r| idx(r)).collect::<Vec<_>>(),
            vec![vec![1, 2, 5], vec![1]]
        );
        let total: u64 = ping
            .schedule
            .servers
            .iter()
            .chain(&pong.schedule.servers)
            .map(|w| w.pairs)
            .sum();
        assert_eq!(
            total,
            batch.iter().map(PackedSeq::causal_pairs).sum::<u64>()
        );
        for t in ping.schedule.servers.iter().flat_map(|w| &w.tasks) {
            assert!(idx(&ping.ranges[t.home as usize]).contains(&t.sample.index));
        }
    }

    #[test]
    fn ping_pong_splits_each_ranks_own_ranges() {
        // One replica, CP 2, capacity 400 (200 per rank), samples 250, 100, 50: rank 0 holds
        // [0, 200) of sample 0; rank 1 its [200, 250), sample 1 and sample 2.
        // Rank 0: one range → all in half 0. Rank 1 by pairs: s0 tail [200,250) 11275 → 0,
        // s1 5050 → 1, s2 1275 → 1 (6325 < 11275).
        let batch = [seq(&[250, 100, 50], 0)];
        let hr = home_ranges(&batch, 2);
        let spans = |r: &[HomeRange]| -> Vec<(u32, u32, u32)> {
            r.iter().map(|h| (h.sample.index, h.lo, h.hi)).collect()
        };
        assert_eq!(spans(&hr[0]), vec![(0, 0, 200)]);
        assert_eq!(spans(&hr[1]), vec![(0, 200, 250), (1, 0, 100), (2, 0, 50)]);
        let [a, b] = nano_split(&hr[1], &Mask::Causal);
        assert_eq!(spans(&a), vec![(0, 200, 250)]);
        assert_eq!(spans(&b), vec![(1, 0, 100), (2, 0, 50)]);
        let c = cfg(0.1, 16);
        let [ping, pong] = schedule_ping_pong_cp(&batch, 2, &c).unwrap();
        assert_eq!(ping.ranges, vec![hr[0].clone(), a]);
        assert_eq!(pong.ranges, vec![Vec::new(), b]);
        let total: u64 = [&ping, &pong]
            .iter()
            .flat_map(|n| &n.schedule.servers)
            .map(|w| w.pairs)
            .sum();
        assert_eq!(total, batch[0].causal_pairs());
        // Causality: capacity 8 on CP 2, samples 3, 3, 2. Rank 0: s1 [0,1) continues onto
        // rank 1 → pinned to 0, then s0 [0,3) → 1. Rank 1: s1 [1,3) continues a piece in
        // nano-batch 0 → free: longest first, s1 [1,3) (first of two 2-token ranges) → 0,
        // s2 → 1.
        let small = [seq(&[3, 3, 2], 0)];
        let sp = nano_splits(&small, 2, &Mask::Causal);
        assert_eq!(
            sp.iter()
                .map(|[a, b]| (spans(a), spans(b)))
                .collect::<Vec<_>>(),
            vec![
                (vec![(1, 0, 1)], vec![(0, 0, 3)]),
                (vec![(1, 1, 3)], vec![(2, 0, 2)])
            ]
        );
        // The pins by hand: unpinned, rank 0 would put s1 [0,1) into 1, and then rank 1's
        // s1 [1,3) must follow it into 1 (the first pin) although the plain split gives 0.
        let hr_small = home_ranges(&small, 2);
        assert_eq!(
            spans(&nano_split(&hr_small[0], &Mask::Causal)[1]),
            vec![(1, 0, 1)]
        );
        assert_eq!(
            spans(&nano_split(&hr_small[1], &Mask::Causal)[0]),
            vec![(1, 1, 3)]
        );
        let [z, o] = nano_split_pinned(&hr_small[1], &Mask::Causal, true, false);
        assert_eq!((spans(&z), spans(&o)), (vec![(2, 0, 2)], vec![(1, 1, 3)]));
        // a range outside its server's slice is refused
        let bad = vec![hr[1].clone(), hr[0].clone()];
        let e = schedule_ranges(&batch, 2, &bad, &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("server 0 home range"), "{e}");
        assert!(schedule_ranges(&batch, 2, &hr[..1], &c).is_err());
        assert!(schedule_cp(&batch, 0, &c).is_err());
    }

    #[test]
    fn two_shards_of_one_document_on_one_target_pay_its_keys_once() {
        // Server 0: one 10-token sample (55 pairs); server 1 empty. ε = 0, tile 1 (so
        // ⌊ε·F̄⌋ = 0 and every item is coarse: phase 0). Deficit ⌊55/2⌋ = 27:
        // 1. a = 11, k = ⌊27/11⌋ = 2: [0,2)+[8,10), 22 pairs, Q 4 + keys [0,10) 20 + out 4
        //    = 28 B. Loads 33 / 22: surplus ⌊(2·33 − 55)/2⌋ = 5, deficit 5.
        // 2. [2,8): a = 11 > 5, head 2k + k(k+1)/2 ≤ 5 → k = 1: [2,3), 3 pairs → server 1
        //    again; its keys [0,3) are already there: Q 1 + out 1 = 2 B (6 B more before the
        //    KV was charged once per (target, sample)). Loads 30 / 25, deficit 2.
        // 3. [3,8): head [3,4) costs 4 > 2 → NoMoveHelps.
        let batch = [seq(&[10], 0), seq(&[], 5)];
        let s = schedule(&batch, &cfg(0.0, 1)).unwrap();
        check_conservation(&batch, 1, &s, &unit());
        assert_eq!(s.stop, Stop::NoMoveHelps);
        assert_eq!((s.servers[0].pairs, s.servers[1].pairs), (30, 25));
        type Moved = (Vec<(u32, u32)>, u64, u64);
        let moves: Vec<Moved> = s
            .transfers
            .iter()
            .map(|t| {
                let task = &s.servers[t.dst as usize].tasks[t.task];
                (task.q_ranges.clone(), t.kv_bytes, t.bytes())
            })
            .collect();
        assert_eq!(
            moves,
            vec![(vec![(0, 2), (8, 10)], 20, 28), (vec![(2, 3)], 0, 2)]
        );
        // The lowering ships keys [0,10) to worker 1 once: the plan's bytes are the
        // scheduler's, 6 of Q and output + 20 of K and V.
        let d = lower::plan_step(0, &batch, 2, &cfg(0.0, 1), false).unwrap();
        assert_eq!(crate::plan::check(&d.plan).unwrap().bytes, s.bytes());
        assert_eq!(s.bytes(), 30);
    }

    #[test]
    fn ping_pong_balances_both_nano_batches_on_a_corpus_batch() {
        // One GA index of the wlbllm corpus at L = 128K on DP 64 × CP 8 (512 servers):
        // long documents span ranks, and their end pieces land in nano-batch 1. Measured
        // before the coarse-first phase and the pair-balanced split: nano-batch 1 stopped
        // at max deviation 12.3 (one rank at 13 F̄: its smallest shard, one tile over a
        // 65K-token prefix, exceeded every deficit left). Now both stay within 0.5 and
        // every server's two nano-batches together within 15% of the mean.
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let batch = global_batch(&corpus, 131_072, 64, Packing::Sequential, 1, 0).unwrap();
        let shape = AttnShape {
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let c = DistcaConfig::new(shape, DEFAULT_EPSILON, 128).unwrap();
        let [a, b] = schedule_ping_pong_cp(&batch, 8, &c).unwrap();
        for n in [&a, &b] {
            assert!(
                n.schedule.max_deviation() < 0.5,
                "{}",
                n.schedule.max_deviation()
            );
        }
        let per: Vec<u64> = (0..512)
            .map(|i| a.schedule.servers[i].pairs + b.schedule.servers[i].pairs)
            .collect();
        let total: u64 = per.iter().sum();
        assert_eq!(
            total,
            batch.iter().map(PackedSeq::causal_pairs).sum::<u64>()
        );
        let mean = total as f64 / 512.0;
        let max = *per.iter().max().unwrap() as f64;
        assert!(max / mean < 1.15, "{}", max / mean);
    }

    #[test]
    fn document_spanning_two_cp_ranks_by_hand() {
        // DP 2 × CP 2, capacity 8 (4 tokens per rank). Replica 0: one 8-token document,
        // [0,4) on server 0 (10 pairs), [4,8) on server 1 (26 pairs); replica 1 empty
        // (servers 2, 3). F̄ = 9, ε = 0.5 (tolerance 4.5), tile 1, unit shape (Q = out =
        // 1 B per token, KV 2 B per key).
        // In place, server 1's [4,8) reads keys [0,8): [0,4) from server 0 = 8 B.
        let batch = [seq(&[8], 0), seq(&[], 5)];
        let mut batch = batch;
        batch[1].capacity = 8;
        let hr = home_ranges(&batch, 2);
        let r = |h: &HomeRange| (h.sample.seq, h.lo, h.hi);
        assert_eq!(hr[0].iter().map(r).collect::<Vec<_>>(), vec![(0, 0, 4)]);
        assert_eq!(hr[1].iter().map(r).collect::<Vec<_>>(), vec![(0, 4, 8)]);
        assert!(hr[2].is_empty() && hr[3].is_empty());
        let loose = schedule_cp(&batch, 2, &cfg(10.0, 1)).unwrap();
        assert!(loose.transfers.is_empty());
        assert_eq!(loose.in_place_kv_bytes(), 8);
        assert_eq!(loose.servers[1].tasks[0].kv_bytes, 8);
        // Phase 0 (coarse items of out-of-tolerance sources: server 1's [4,8), whose
        // one-query head costs 5 > ⌊ε·F̄⌋ = 4; server 0's [0,4) leaves in pieces ≤ 4):
        // 1. target 2 (deficit 9, lowest index), cap 9: [4,8) costs 26, no pair (a = 13);
        //    head 4k + k(k+1)/2 ≤ 9 → k = 1: [4,5), 5 pairs; Q 1 + keys [0,5) 10 + out 1 =
        //    12 B. Loads 10 21 5 0.
        // 2. target 3 (deficit 9), cap 9: [5,8) costs 21, no pair (a = 14); head k = 1:
        //    [5,6), 6 pairs, 1 + 12 + 1 = 14 B. Loads 10 15 5 6.
        // 3. targets 2 (deficit 4) and 3 (3): [6,8) has no shard under 4, nor under the
        //    fallback's caps min(deficit + ⌊ε·F̄⌋ = 4, surplus 6) = 6 (its head [6,7)
        //    costs 7), and neither has fine items to make room with → both stuck.
        // Phase 1 (any item of server 1): the same → stuck.
        // Phase 2 (server 0, surplus 1, may give): target 2, cap 1: head [0,1) of [0,4),
        //    1 pair, Q 1 + out 1 = 2 B: its keys [0,1) already reached server 2 with the
        //    [4,5) move (KV charged once per (server, sample)). Loads 9 15 6 6; server 1 is 6 > 4.5 over F̄ but
        //    [6,8) has no shard under the deficits of 3 (nor 6 with the fallback)
        //    → NoMoveHelps.
        let s = schedule_cp(&batch, 2, &cfg(0.5, 1)).unwrap();
        check_conservation(&batch, 2, &s, &unit());
        assert_eq!(s.stop, Stop::NoMoveHelps);
        let loads: Vec<u64> = s.servers.iter().map(|w| w.pairs).collect();
        assert_eq!(loads, vec![9, 15, 6, 6]);
        type Moved = (u32, u32, Vec<(u32, u32)>, u64);
        let moves: Vec<Moved> = s
            .transfers
            .iter()
            .map(|t| {
                let task = &s.servers[t.dst as usize].tasks[t.task];
                (t.src, t.dst, task.q_ranges.clone(), t.bytes())
            })
            .collect();
        assert_eq!(
            moves,
            vec![
                (1, 2, vec![(4, 5)], 12),
                (0, 2, vec![(0, 1)], 2),
                (1, 3, vec![(5, 6)], 14),
            ]
        );
        // left in place: [1,4) on server 0 (no remote keys), [6,8) on server 1 (keys [0,4)
        // from server 0: 8 B).
        let kept: Vec<(Vec<(u32, u32)>, u64)> = s.servers[..2]
            .iter()
            .map(|w| (w.tasks[0].q_ranges.clone(), w.tasks[0].kv_bytes))
            .collect();
        assert_eq!(kept, vec![(vec![(1, 4)], 0), (vec![(6, 8)], 8)]);
        assert_eq!(
            (s.moved_bytes(), s.in_place_kv_bytes(), s.bytes()),
            (28, 8, 36)
        );
    }

    #[test]
    fn target_holding_part_of_the_prefix_pays_only_the_rest() {
        // DP 1 × CP 2, capacity 8: samples 2 and 6. Server 0 holds sample 0 and [0,2) of
        // sample 1 (3 + 3 pairs); server 1 holds [2,6) of sample 1 (3+4+5+6 = 18 pairs) and
        // reads keys [0,2) of it from server 0 in place (4 B). F̄ = 12, ε = 0.3, tile 1.
        // Target 0, cap 6: [2,6) costs 18, no pair (a = 9); head 2k + k(k+1)/2 ≤ 6 → k = 1:
        // [2,3), 3 pairs, keys [0,3) of which server 0 holds [0,2): KV 1 key = 2 B, + Q 1
        // + out 1 = 4 B. Loads 9 / 15: |15 − 12| = 3 ≤ 3.6 → Balanced.
        let batch = [seq(&[2, 6], 0)];
        let s = schedule_cp(&batch, 2, &cfg(0.3, 1)).unwrap();
        check_conservation(&batch, 2, &s, &unit());
        let task = balanced_by_one_move(&s, (9, 15), (1, 0, 1, 2, 1));
        assert_eq!(
            (task.sample.index, task.q_ranges.clone()),
            (1, vec![(2, 3)])
        );
        // server 1 keeps [3,6), reading keys [0,2) from server 0: 4 B
        assert_eq!(s.servers[1].tasks[0].q_ranges, vec![(3, 6)]);
        assert_eq!((s.in_place_kv_bytes(), s.bytes()), (4, 8));
    }

    /// The stop rule (Balanced exactly when every server is within ε), senders ending ≥ F̄
    /// and receivers ≤ F̄ (1 + ε) (≤ F̄ unless the fallback filled them into tolerance above
    /// F̄). Unit heads: FLOPs = 4·pairs.
    fn check_stop_and_bounds(s: &DistcaSchedule, eps: f64) {
        match s.stop {
            Stop::Balanced => assert!(s.max_deviation() <= eps + 1e-9),
            Stop::NoMoveHelps => assert!(s.max_deviation() > eps - 1e-9),
        }
        let ideal = s.ideal_flops / 4.0;
        for t in &s.transfers {
            assert!(s.servers[t.src as usize].pairs as f64 >= ideal - 1e-6);
            assert!(s.servers[t.dst as usize].pairs as f64 <= ideal * (1.0 + eps) + 1e-6);
        }
    }

    /// Asserts a Balanced two-server schedule with these loads (pairs) and one transfer
    /// (src, dst, Q, KV, output bytes); returns the moved task.
    fn balanced_by_one_move(
        s: &DistcaSchedule,
        loads: (u64, u64),
        bytes: (u32, u32, u64, u64, u64),
    ) -> &AttnTask {
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!((s.servers[0].pairs, s.servers[1].pairs), loads);
        assert_eq!(s.transfers.len(), 1);
        let t = &s.transfers[0];
        assert_eq!((t.src, t.dst, t.q_bytes, t.kv_bytes, t.out_bytes), bytes);
        &s.servers[t.dst as usize].tasks[t.task]
    }

    fn sliding(w: u32, eps: f64, tile: u32) -> (AttnShape, DistcaConfig) {
        let shape = AttnShape {
            mask: Mask::Sliding { w },
            ..unit()
        };
        let c = DistcaConfig::new(shape, eps, tile)
            .unwrap()
            .with_scheduler(DistcaScheduler::Tight);
        (shape, c)
    }

    #[test]
    fn sliding_window_shard_by_hand() {
        // CP 1, servers [6] and [2] under sliding:2 (keys per query 1, 2, 2, …): 11 and 3
        // pairs (causal: 21 and 3). F̄ = 7, ε = 0.15, tile 1; ⌊ε·F̄⌋ = 1 pair: the 6 has
        // one exportable pair (its first query) so phase 0 has no candidate; phase 1, cap
        // = min(deficit 4, surplus 4) = 4. Head+tail: the causal k = ⌊4/7⌋ = 0, but under
        // the window k = 1 costs keys(0) + keys(5) = 1 + 2 = 3 ≤ 4 and k = 2 costs 7: the
        // shard [0,1) + [5,6), 3 pairs, reaching keys [0, 6): KV 6 keys = 12 B, Q 2 + out 2.
        // Loads 8 / 6: |8·2 − 14| = 2 ≤ 0.15·14 → Balanced.
        let batch = [seq(&[6], 0), seq(&[2], 1)];
        let (shape, c) = sliding(2, 0.15, 1);
        let s = schedule_cp(&batch, 1, &c).unwrap();
        check_conservation(&batch, 1, &s, &shape);
        let task = balanced_by_one_move(&s, (8, 6), (0, 1, 2, 12, 2));
        assert_eq!(
            (task.q_ranges.clone(), task.kv_prefix, task.pairs),
            (vec![(0, 1), (5, 6)], 6, 3)
        );
        assert_eq!(s.servers[0].tasks[0].q_ranges, vec![(1, 5)]);
    }

    #[test]
    fn window_straddling_a_rank_boundary_reads_only_its_reach() {
        // DP 1 × CP 2, one sample of 8 tokens under sliding:2: rank 0 holds [0,4) (1+2+2+2
        // = 7 pairs), rank 1 [4,8) (8 pairs). Total 15: |7·2 − 15| = 1 and |8·2 − 15| = 1
        // ≤ 0.1·15, Balanced with no move. Rank 1's queries reach keys [3, 8): it reads one
        // key from rank 0 in place (2 B; causally [0,4), 8 B, and 10 / 26 pairs).
        let batch = [seq(&[8], 0)];
        let (shape, c) = sliding(2, 0.1, 1);
        let s = schedule_cp(&batch, 2, &c).unwrap();
        check_conservation(&batch, 2, &s, &shape);
        assert_eq!(s.stop, Stop::Balanced);
        assert!(s.transfers.is_empty());
        assert_eq!((s.servers[0].pairs, s.servers[1].pairs), (7, 8));
        let t = &s.servers[1].tasks[0];
        assert_eq!(
            (t.q_ranges.clone(), t.kv_prefix, t.kv_bytes),
            (vec![(4, 8)], 8, 2)
        );
        assert_eq!(s.in_place_kv_bytes(), 2);
        let causal = schedule_cp(&batch, 2, &cfg(10.0, 1)).unwrap();
        assert_eq!(causal.servers[1].tasks[0].kv_bytes, 8);
    }

    #[test]
    fn largest_fitting_finds_the_last_multiple() {
        // fits up to 37: from 0 in steps of 4 → 36; from the answer itself → itself; capped.
        let f = |k: u64| k <= 37;
        assert_eq!(largest_fitting(0, 100, 4, f), 36);
        assert_eq!(largest_fitting(36, 100, 4, f), 36);
        assert_eq!(largest_fitting(8, 20, 4, f), 20);
        assert_eq!(largest_fitting(0, 3, 4, f), 0);
        assert_eq!(largest_fitting(0, 1000, 1, |k| k * k <= 500), 22);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let e = DistcaConfig::new(unit(), -0.1, 128)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("epsilon") && e.contains("-0.1") && e.contains("≥ 0"),
            "{e}"
        );
        assert!(DistcaConfig::new(unit(), f64::NAN, 128).is_err());
        assert!(DistcaConfig::new(unit(), 0.1, 0).is_err());
        assert!(schedule(&[], &cfg(0.1, 128)).is_err());
        let zero = schedule(&[seq(&[], 0)], &cfg(0.1, 128)).unwrap();
        assert_eq!(zero.stop, Stop::Balanced);
        assert_eq!(causal_pairs(0), 0);
    }

    proptest! {
        /// Both schedulers under a mask: every query once, exact pairs of the mask, KV =
        /// the reach the server lacks (the tight one: `check_conservation`), stop rule and
        /// the F̄ bounds of the tight one, and plans that pass `plan::check` under the mask.
        #[test]
        fn random_batches_under_a_mask_conserve_and_plans_check(
            servers in proptest::collection::vec(
                proptest::collection::vec(1u32..2000, 0..6), 1..7),
            cp in 1u32..4,
            eps in 0.0f64..0.5,
            tile in prop_oneof![Just(1u32), Just(16), Just(128)],
            mask in prop_oneof![
                (1u32..3000).prop_map(|w| Mask::Sliding { w }),
                (1u32..1500).prop_map(|c| Mask::Chunked { c }),
                (1u32..200, 1u32..4, 0u32..3)
                    .prop_map(|(block, local, global)| Mask::BlockSparse { block, local, global }),
            ],
            ping_pong in any::<bool>(),
        ) {
            let batch: Vec<PackedSeq> =
                servers.iter().enumerate().map(|(i, l)| seq(l, 100 * i as u64)).collect();
            let shape = AttnShape { mask, ..unit() };
            let c = DistcaConfig::new(shape, eps, tile).unwrap().with_scheduler(DistcaScheduler::Tight);
            let s = schedule_cp(&batch, cp, &c).unwrap();
            check_conservation(&batch, cp, &s, &shape);
            check_stop_and_bounds(&s, eps);
            let exact: u64 = batch
                .iter()
                .flat_map(|q| &q.samples)
                .map(|x| mask.pairs(u64::from(x.len)))
                .sum();
            for sched in [DistcaScheduler::Tight, DistcaScheduler::Reference] {
                let c = c.with_scheduler(sched);
                let dp = batch.len() as u32;
                let d = lower::plan_step_cp(0, &batch, dp, cp, &c, ping_pong).unwrap();
                let sum = crate::plan::check(&d.plan);
                prop_assert!(sum.is_ok(), "{:?}", sum);
                let want = shape.fwd_flops(exact, shape.heads_q);
                prop_assert!((sum.unwrap().flops - want).abs() <= 1e-9 * want.max(1.0));
                let pairs: u64 = d.schedules.iter().flatten().flat_map(|x| &x.servers).map(|w| w.pairs).sum();
                prop_assert_eq!(pairs, exact);
            }
        }

        /// `State::smallest_move` is exactly the least cap under which `State::evaluate`
        /// finds a move (what lets `best_move` skip a candidate unevaluated), for every
        /// item of a batch, under every mask, at caps around it.
        #[test]
        fn evaluate_finds_a_move_exactly_from_the_smallest_move(
            servers in proptest::collection::vec(
                proptest::collection::vec(1u32..2000, 0..6), 1..7),
            cp in 1u32..4,
            tile in prop_oneof![Just(1u32), Just(16), Just(128)],
            mask in prop_oneof![
                Just(Mask::Causal),
                (1u32..3000).prop_map(|w| Mask::Sliding { w }),
                (1u32..1500).prop_map(|c| Mask::Chunked { c }),
                (1u32..200, 1u32..4, 0u32..3)
                    .prop_map(|(block, local, global)| Mask::BlockSparse { block, local, global }),
            ],
        ) {
            let batch: Vec<PackedSeq> =
                servers.iter().enumerate().map(|(i, l)| seq(l, 100 * i as u64)).collect();
            let shape = AttnShape { mask, ..unit() };
            let c = DistcaConfig::new(shape, 0.1, tile).unwrap();
            let st = State::new(&batch, cp, &home_ranges(&batch, cp), &c).unwrap();
            let last = st.load.len() - 1;
            for (id, it) in st.items.iter().enumerate() {
                let m = st.smallest_move(it);
                let f = it.pairs(&mask);
                for cap in [m - 1, m, m + 1, f - 1, f, f + 7] {
                    for target in [0, last] {
                        prop_assert_eq!(
                            st.evaluate(id, cap, target).is_some(),
                            cap >= m,
                            "item {:?}, cap {}, smallest {}", it, cap, m
                        );
                    }
                }
            }
        }

        #[test]
        fn random_batches_conserve_and_stop_correctly(
            servers in proptest::collection::vec(
                proptest::collection::vec(1u32..2000, 0..6), 1..9),
            cp in 1u32..5,
            slack in 0u32..300,
            eps in 0.0f64..0.5,
            tile in prop_oneof![Just(1u32), Just(16), Just(128)],
        ) {
            let batch: Vec<PackedSeq> = servers
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let mut q = seq(l, 100 * i as u64);
                    q.capacity += slack;
                    q
                })
                .collect();
            let c = cfg(eps, tile);
            let s = schedule_cp(&batch, cp, &c).unwrap();
            check_conservation(&batch, cp, &s, &unit());
            check_stop_and_bounds(&s, eps);
            prop_assert_eq!(&s, &schedule_cp(&batch, cp, &c).unwrap());
            // Ping-pong: causal (a piece in nano-batch 0 has every earlier piece of its
            // document in nano-batch 0) and both halves together cover every home range once.
            let [a, b] = schedule_ping_pong_cp(&batch, cp, &c).unwrap();
            for (s1, one) in b.ranges.iter().enumerate() {
                for h in one {
                    for zero in a.ranges.iter().skip(s1 + 1) {
                        prop_assert!(
                            !zero.iter().any(|z| z.sample == h.sample && z.lo >= h.hi),
                            "nano 0 piece after nano 1 piece {h:?}"
                        );
                    }
                }
            }
            let hr = home_ranges(&batch, cp);
            for (i, want) in hr.iter().enumerate() {
                let mut got = a.ranges[i].clone();
                got.extend(b.ranges[i].iter().copied());
                got.sort_by_key(|h| (h.sample, h.lo));
                prop_assert_eq!(&got, want);
            }
        }
    }
}
