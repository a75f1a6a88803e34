//! DistCA (Zhuang, Chen et al., "Efficient Long-context Language Model Training by Core
//! Attention Disaggregation", arXiv:2510.18121): the planning half.
//!
//! Owns the core-attention scheduler and the ping-pong nano-batch split, and their lowering
//! to a `Plan` ([`lower`], through `plan::build`). May not touch the engine, `cost/`
//! formulas or `grouping.rs`; FLOPs and bytes come from [`AttnShape`] only.
//!
//! # In-place attention servers (paper: "in-place attention servers")
//!
//! Every GPU runs its own linear layers and also serves core-attention tasks; the attention
//! pool is the whole cluster (P = DP servers). Server `s` starts with the core attention of
//! its own micro-batch (`batch[s]`): one *item* per sample, queries `[0, len)`.
//!
//! # Scheduler (paper: the communication-aware greedy scheduler)
//!
//! Loads are counted in exact causal query–key pairs (FLOPs = `AttnShape::fwd_flops(pairs,
//! heads_q)`, a constant factor, so ratios and balance are the same in either unit).
//! The ideal load is F̄ = total / P. A server is *in surplus* above F̄ and *in deficit* below
//! it; it is *within tolerance* when |F_s − F̄| ≤ ε·F̄. Until every server is within
//! tolerance:
//!
//! 1. the target is the deficit server with the largest deficit (lowest index on a tie)
//!    that has not been found stuck;
//! 2. candidate items are those still on a *source*: in phase 1 a surplus server out of
//!    tolerance (so moves drain the servers that break the stopping rule, and none drains
//!    a server that is already fine); in phase 2 — once no such server is left, or none of
//!    them can help any target — any surplus server;
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
//!    items numbered by server then sample); bytes = Q and output of the moved queries
//!    (`q_bytes`) + K and V of the key prefix they attend to, `[0, last query + 1)`
//!    (`kv_bytes`);
//! 5. a target with no candidate giving a move is *stuck* for the phase (moves only shrink
//!    every ΔF_max and the set of sources); the scheduler stops when all servers are within
//!    tolerance ([`Stop::Balanced`]) or every deficit server is stuck in phase 2
//!    ([`Stop::NoMoveHelps`]).
//!
//! Surplus servers only lose work down to F̄ and deficit servers only gain up to F̄, so an
//! item that moved is never moved again; a whole move's ratio bounds any shard's ratio of
//! the same item (k·A / (4k·q + kv) grows with k, and so does a head shard's ratio, which
//! equals the whole move's at k = hi − lo), which lets the search stop early.
//!
//! # Ping-pong (paper: "ping-pong execution")
//!
//! Each micro-batch is split into two nano-batches, whole samples, by tokens (longest first
//! onto the lighter half), and each nano-batch is scheduled on its own
//! ([`schedule_ping_pong`]): the engine overlaps nano-batch 0's attention transfers with
//! nano-batch 1's compute and the other way round. This module only describes the split.

pub mod lower;
pub mod pingpong;

use std::cmp::Reverse;
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::cost::AttnShape;
use crate::error::{invalid, Result};
use crate::workload::{PackedSeq, Sample};

/// The default tolerance ε.
pub const DEFAULT_EPSILON: f64 = 0.10;

/// Checked scheduler parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistcaConfig {
    /// The attention shape one server computes with (heads as held on one GPU).
    pub shape: AttnShape,
    /// Tolerance ε: a server is balanced when |F_s − F̄| ≤ ε·F̄.
    pub epsilon: f64,
    /// Shard granularity in tokens (the kernel tile, 128).
    pub tile: u32,
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
        })
    }
}

/// A sample by position: `batch[server].samples[index]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleRef {
    /// The server whose micro-batch holds the sample (its home: Q, K, V and the output live
    /// there).
    pub server: u32,
    /// Position of the sample in that micro-batch.
    pub index: u32,
}

/// One core-attention task: some query ranges of one sample over a prefix of its keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttnTask {
    /// Where the sample lives.
    pub sample: SampleRef,
    /// The sample itself.
    pub of: Sample,
    /// Query ranges `[lo, hi)`, relative to the sample, ascending (one, or a head+tail pair).
    pub q_ranges: Vec<(u32, u32)>,
    /// The keys needed: `[0, kv_prefix)` of the sample (= the last query + 1).
    pub kv_prefix: u32,
    /// Exact causal pairs.
    pub pairs: u64,
    /// Forward FLOPs (`AttnShape::fwd_flops(pairs, heads_q)`).
    pub flops: f64,
}

/// The data one moved task needs: Q and KV from the sample's home to the executing server,
/// and the output back.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    /// The sample's home server.
    pub src: u32,
    /// The server that executes the task.
    pub dst: u32,
    /// Index of the task in `servers[dst].tasks`.
    pub task: usize,
    /// Bytes of Q, src → dst.
    pub q_bytes: u64,
    /// Bytes of K and V of the prefix, src → dst.
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
    /// Its tasks: what stayed of its own samples, in sample order, then what it received,
    /// in move order.
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

    /// Bytes of all transfers.
    pub fn bytes(&self) -> u64 {
        self.transfers.iter().map(Transfer::bytes).sum()
    }
}

/// Exact causal pairs of queries `[lo, hi)`: Σ_{q=lo}^{hi−1} (q + 1).
fn range_pairs(lo: u32, hi: u32) -> u64 {
    let (lo, hi) = (u64::from(lo), u64::from(hi));
    (hi - lo) * (lo + hi + 1) / 2
}

/// What is left of a sample on its home server: queries `[lo, hi)`.
#[derive(Clone, Copy, Debug)]
struct Item {
    home: u32,
    index: u32,
    sample: Sample,
    lo: u32,
    hi: u32,
}

impl Item {
    fn pairs(&self) -> u64 {
        range_pairs(self.lo, self.hi)
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

struct State<'a> {
    cfg: &'a DistcaConfig,
    items: Vec<Item>,
    /// Items by server.
    by_server: Vec<Vec<usize>>,
    load: Vec<u64>,
    total: u128,
    servers: u128,
    /// Candidates on source servers: (whole-move ratio, descending; item).
    candidates: BTreeSet<(Reverse<u64>, usize)>,
    keys: Vec<Option<u64>>,
    /// Phase 2: every surplus server is a source (phase 1: only those out of tolerance).
    all_sources: bool,
}

impl State<'_> {
    /// load·P − total: positive in surplus, negative in deficit (P × the excess).
    fn excess(&self, s: usize) -> i128 {
        (u128::from(self.load[s]) * self.servers) as i128 - self.total as i128
    }

    fn surplus(&self, s: usize) -> u64 {
        let e = self.excess(s);
        if e > 0 {
            (e as u128 / self.servers) as u64
        } else {
            0
        }
    }

    fn deficit(&self, s: usize) -> u64 {
        let e = self.excess(s);
        if e < 0 {
            ((-e) as u128 / self.servers) as u64
        } else {
            0
        }
    }

    fn within(&self, s: usize) -> bool {
        (self.excess(s).unsigned_abs() as f64) <= self.cfg.epsilon * self.total as f64
    }

    fn bytes(&self, q_tokens: u64, kv_prefix: u32) -> (u64, u64, u64) {
        let sh = &self.cfg.shape;
        let q = sh.q_bytes(q_tokens, sh.heads_q);
        let kv = sh.kv_bytes(u64::from(kv_prefix), sh.heads_kv);
        (q, kv, q)
    }

    fn ratio(&self, pairs: u64, q_tokens: u64, kv_prefix: u32) -> f64 {
        let (q, kv, o) = self.bytes(q_tokens, kv_prefix);
        pairs as f64 / (q + kv + o).max(1) as f64
    }

    fn whole_ratio(&self, it: &Item) -> f64 {
        self.ratio(it.pairs(), u64::from(it.hi - it.lo), it.hi)
    }

    /// Whether server `s`'s items are candidates in the current phase.
    fn is_source(&self, s: usize) -> bool {
        self.surplus(s) > 0 && (self.all_sources || !self.within(s))
    }

    fn set_key(&mut self, id: usize) {
        if let Some(k) = self.keys[id].take() {
            self.candidates.remove(&(Reverse(k), id));
        }
        let it = self.items[id];
        if it.lo < it.hi && self.is_source(it.home as usize) {
            let k = self.whole_ratio(&it).to_bits();
            self.candidates.insert((Reverse(k), id));
            self.keys[id] = Some(k);
        }
    }

    /// The move of item `id` under cap `cap` pairs, if any.
    fn evaluate(&self, id: usize, cap: u64) -> Option<Move> {
        let it = &self.items[id];
        let f = it.pairs();
        if f == 0 || cap == 0 {
            return None;
        }
        if f <= cap {
            let ratio = self.whole_ratio(it);
            return Some(Move {
                item: id,
                shard: Shard::Whole,
                pairs: f,
                ratio,
            });
        }
        let (lo, hi) = (u64::from(it.lo), u64::from(it.hi));
        let tile = u64::from(self.cfg.tile);
        let a = lo + hi + 1;
        let k = (cap / a) / tile * tile;
        if k > 0 {
            // f > cap ≥ k·a ⇒ 2k < hi − lo, so the shard is a proper head+tail pair.
            let pairs = k * a;
            return Some(Move {
                item: id,
                shard: Shard::HeadTail(k as u32),
                pairs,
                ratio: self.ratio(pairs, 2 * k, it.hi),
            });
        }
        // Head only: the largest k in whole tiles with k·lo + k(k+1)/2 ≤ cap (< hi − lo,
        // since the whole item costs more than cap).
        let head = |k: u64| k * lo + k * (k + 1) / 2;
        let b = (2 * lo + 1) as f64;
        let mut k = (((b * b + 8.0 * cap as f64).sqrt() - b) / 2.0).max(0.0) as u64;
        while k > 0 && head(k) > cap {
            k -= 1;
        }
        while head(k + 1) <= cap {
            k += 1;
        }
        let k = k / tile * tile;
        if k == 0 {
            return None;
        }
        let pairs = head(k);
        Some(Move {
            item: id,
            shard: Shard::Head(k as u32),
            pairs,
            ratio: self.ratio(pairs, k, it.lo + k as u32),
        })
    }

    fn better(best: &Option<Move>, m: &Move) -> bool {
        best.is_none_or(|b| m.ratio > b.ratio || (m.ratio == b.ratio && m.item < b.item))
    }

    /// The best move into `target` from the current candidates. Items are visited by their
    /// whole-move ratio, an upper bound of any move of theirs, so the scan stops as soon as
    /// that bound cannot beat the best move found.
    fn best_move(&self, target: usize) -> Option<Move> {
        let deficit = self.deficit(target);
        let mut best: Option<Move> = None;
        for &(Reverse(ub), id) in &self.candidates {
            if best.is_some_and(|b| f64::from_bits(ub) <= b.ratio) {
                break;
            }
            let cap = deficit.min(self.surplus(self.items[id].home as usize));
            if let Some(m) = self.evaluate(id, cap) {
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
}

/// Schedules the core attention of one batch: `batch[s]` is server `s`'s micro-batch.
pub fn schedule(batch: &[PackedSeq], cfg: &DistcaConfig) -> Result<DistcaSchedule> {
    let servers: Vec<Vec<(u32, Sample)>> = batch
        .iter()
        .map(|seq| {
            seq.samples
                .iter()
                .enumerate()
                .map(|(i, s)| (i as u32, *s))
                .collect()
        })
        .collect();
    schedule_samples(&servers, cfg)
}

/// Schedules per-server lists of `(index in the server's micro-batch, sample)`.
pub fn schedule_samples(
    servers: &[Vec<(u32, Sample)>],
    cfg: &DistcaConfig,
) -> Result<DistcaSchedule> {
    if servers.is_empty() {
        return Err(invalid("servers", 0, "at least one attention server"));
    }
    let p = servers.len();
    let mut items = Vec::new();
    let mut by_server = vec![Vec::new(); p];
    let mut load = vec![0u64; p];
    for (s, list) in servers.iter().enumerate() {
        for &(index, sample) in list {
            let it = Item {
                home: s as u32,
                index,
                sample,
                lo: 0,
                hi: sample.len,
            };
            load[s] += it.pairs();
            by_server[s].push(items.len());
            items.push(it);
        }
    }
    let total: u128 = load.iter().map(|&l| u128::from(l)).sum();
    let n_items = items.len();
    let mut st = State {
        cfg,
        items,
        by_server,
        load,
        total,
        servers: p as u128,
        candidates: BTreeSet::new(),
        keys: vec![None; n_items],
        all_sources: false,
    };
    st.rekey_all();
    let mut received: Vec<Vec<(AttnTask, Transfer)>> = vec![Vec::new(); p];
    let mut stuck = vec![false; p];
    let stop = loop {
        if (0..p).all(|s| st.within(s)) {
            break Stop::Balanced;
        }
        // Largest deficit first, lowest index on a tie.
        let target = (0..p)
            .filter(|&s| !stuck[s] && st.deficit(s) > 0)
            .max_by_key(|&s| (st.deficit(s), Reverse(s)));
        let Some(target) = target else {
            if st.all_sources {
                break Stop::NoMoveHelps;
            }
            // Phase 2: the out-of-tolerance sources cannot help any target any more; let
            // every surplus server give.
            st.all_sources = true;
            st.rekey_all();
            stuck.fill(false);
            continue;
        };
        let Some(m) = st.best_move(target) else {
            stuck[target] = true;
            continue;
        };
        let it = st.items[m.item];
        let home = it.home as usize;
        let q_ranges = match m.shard {
            Shard::Whole => {
                st.items[m.item].lo = it.hi;
                vec![(it.lo, it.hi)]
            }
            Shard::HeadTail(k) => {
                st.items[m.item].lo = it.lo + k;
                st.items[m.item].hi = it.hi - k;
                vec![(it.lo, it.lo + k), (it.hi - k, it.hi)]
            }
            Shard::Head(k) => {
                st.items[m.item].lo = it.lo + k;
                vec![(it.lo, it.lo + k)]
            }
        };
        let kv_prefix = q_ranges.last().map_or(it.hi, |r| r.1);
        let q_tokens: u64 = q_ranges.iter().map(|&(a, b)| u64::from(b - a)).sum();
        st.load[home] -= m.pairs;
        st.load[target] += m.pairs;
        if st.is_source(home) {
            st.set_key(m.item);
        } else {
            for id in st.by_server[home].clone() {
                st.set_key(id);
            }
        }
        if !st.all_sources && st.candidates.is_empty() {
            // No out-of-tolerance source left: phase 2 (see the loop's head).
            st.all_sources = true;
            st.rekey_all();
            stuck.fill(false);
        }
        let (q_bytes, kv_bytes, out_bytes) = st.bytes(q_tokens, kv_prefix);
        let task = AttnTask {
            sample: SampleRef {
                server: it.home,
                index: it.index,
            },
            of: it.sample,
            q_ranges,
            kv_prefix,
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
        received[target].push((task, transfer));
    };
    let mut out_servers = Vec::with_capacity(p);
    let mut transfers = Vec::new();
    for (s, got) in received.into_iter().enumerate() {
        let mut tasks: Vec<AttnTask> = st.by_server[s]
            .iter()
            .map(|&id| st.items[id])
            .filter(|it| it.lo < it.hi)
            .map(|it| {
                let pairs = it.pairs();
                AttnTask {
                    sample: SampleRef {
                        server: it.home,
                        index: it.index,
                    },
                    of: it.sample,
                    q_ranges: vec![(it.lo, it.hi)],
                    kv_prefix: it.hi,
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
    Ok(DistcaSchedule {
        servers: out_servers,
        transfers,
        ideal_flops: cfg.shape.fwd_flops(1, cfg.shape.heads_q) * total as f64 / p as f64,
        epsilon: cfg.epsilon,
        stop,
    })
}

/// The two nano-batches of one micro-batch: sample indices, each in position order.
pub fn nano_batches(seq: &PackedSeq) -> [Vec<u32>; 2] {
    let mut order: Vec<u32> = (0..seq.samples.len() as u32).collect();
    order.sort_by_key(|&i| (Reverse(seq.samples[i as usize].len), i));
    let mut halves: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    let mut tokens = [0u64; 2];
    for i in order {
        let h = usize::from(tokens[1] < tokens[0]);
        tokens[h] += u64::from(seq.samples[i as usize].len);
        halves[h].push(i);
    }
    for h in &mut halves {
        h.sort_unstable();
    }
    halves
}

/// One nano-batch: which samples of each server's micro-batch it holds, and its schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NanoBatch {
    /// Per server, the indices of its samples in this nano-batch.
    pub samples: Vec<Vec<u32>>,
    /// The core-attention schedule of this nano-batch over all servers.
    pub schedule: DistcaSchedule,
}

/// Ping-pong: every micro-batch split into two nano-batches ([`nano_batches`]), each
/// scheduled over all servers. The engine runs nano-batch 0's transfers while nano-batch 1
/// computes, and the other way round.
pub fn schedule_ping_pong(batch: &[PackedSeq], cfg: &DistcaConfig) -> Result<[NanoBatch; 2]> {
    let splits: Vec<[Vec<u32>; 2]> = batch.iter().map(nano_batches).collect();
    let nano = |h: usize| -> Result<NanoBatch> {
        let samples: Vec<Vec<u32>> = splits.iter().map(|s| s[h].clone()).collect();
        let lists: Vec<Vec<(u32, Sample)>> = samples
            .iter()
            .zip(batch)
            .map(|(idx, seq)| idx.iter().map(|&i| (i, seq.samples[i as usize])).collect())
            .collect();
        Ok(NanoBatch {
            schedule: schedule_samples(&lists, cfg)?,
            samples,
        })
    };
    Ok([nano(0)?, nano(1)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::causal_pairs;
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};
    use proptest::prelude::*;

    /// 1 head, head_dim 1, 1 byte: FLOPs = 4·pairs; Q = out = tokens bytes, KV = 2·tokens.
    fn unit() -> AttnShape {
        AttnShape {
            heads_q: 1,
            heads_kv: 1,
            head_dim: 1,
            dtype_bytes: 1,
        }
    }

    fn cfg(eps: f64, tile: u32) -> DistcaConfig {
        DistcaConfig::new(unit(), eps, tile).unwrap()
    }

    fn seq(lens: &[u32], doc0: u64) -> PackedSeq {
        PackedSeq::from_lengths(lens, lens.iter().sum::<u32>().max(1), doc0)
    }

    /// Every query token of every sample attended exactly once, task pairs exact, KV prefix
    /// = the last query + 1, loads and the FLOP total exact; transfers match moved tasks.
    fn check_conservation(batch: &[PackedSeq], s: &DistcaSchedule, shape: &AttnShape) {
        let mut hit: Vec<Vec<Vec<u8>>> = batch
            .iter()
            .map(|q| q.samples.iter().map(|x| vec![0; x.len as usize]).collect())
            .collect();
        let mut total = 0u64;
        for (dst, w) in s.servers.iter().enumerate() {
            let mut load = 0;
            for t in &w.tasks {
                let mut pairs = 0;
                for &(lo, hi) in &t.q_ranges {
                    assert!(lo < hi);
                    pairs += range_pairs(lo, hi);
                    for q in lo..hi {
                        hit[t.sample.server as usize][t.sample.index as usize][q as usize] += 1;
                    }
                }
                assert_eq!(t.pairs, pairs);
                assert_eq!(t.kv_prefix, t.q_ranges.last().unwrap().1);
                assert_eq!(t.flops, shape.fwd_flops(t.pairs, shape.heads_q));
                assert_eq!(
                    t.of,
                    batch[t.sample.server as usize].samples[t.sample.index as usize]
                );
                load += t.pairs;
            }
            assert_eq!(w.pairs, load);
            total += load;
            let moved_in = w
                .tasks
                .iter()
                .filter(|t| t.sample.server as usize != dst)
                .count();
            let transfers_in = s.transfers.iter().filter(|t| t.dst as usize == dst).count();
            assert_eq!(moved_in, transfers_in);
        }
        assert!(hit.iter().flatten().flatten().all(|&h| h == 1));
        let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
        assert_eq!(total, exact);
        let flops: f64 = s.servers.iter().map(|w| w.flops).sum();
        let want = shape.fwd_flops(exact, shape.heads_q);
        assert!((flops - want).abs() <= 1e-9 * want);
        for t in &s.transfers {
            let task = &s.servers[t.dst as usize].tasks[t.task];
            assert_eq!(task.sample.server, t.src);
            assert_ne!(t.src, t.dst);
            let q: u64 = task.q_ranges.iter().map(|&(a, b)| u64::from(b - a)).sum();
            assert_eq!(t.q_bytes, shape.q_bytes(q, shape.heads_q));
            assert_eq!(t.out_bytes, t.q_bytes);
            assert_eq!(
                t.kv_bytes,
                shape.kv_bytes(u64::from(task.kv_prefix), shape.heads_kv)
            );
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
        check_conservation(&batch, &s, &unit());
        // With ε = 0.1 (0.7 < 1) the same state is out of tolerance and stuck.
        let s = schedule(&batch, &cfg(0.1, 1)).unwrap();
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!((s.servers[0].pairs, s.servers[1].pairs), (7, 7));
        let t = &s.servers[1].tasks[s.transfers[1].task];
        assert_eq!(
            (t.of.len, t.q_ranges.clone(), t.kv_prefix),
            (2, vec![(0, 1)], 1)
        );
        check_conservation(&batch, &s, &unit());
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
        check_conservation(&batch, &s, &unit());
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
        check_conservation(&batch, &s, &unit());
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
        check_conservation(&batch, &s, &unit());
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
        check_conservation(&batch, &s, &unit());
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
        };
        let c = DistcaConfig::new(shape, DEFAULT_EPSILON, 128).unwrap();
        let s = schedule(&batch, &c).unwrap();
        check_conservation(&batch, &s, &shape);
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
        check_conservation(&batch, &tight, &shape);
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
        };
        let c = DistcaConfig::new(shape, DEFAULT_EPSILON, 128).unwrap();
        for (corpus, l) in [("wlbllm", 131_072), ("libra-256k", 262_144)] {
            let corpus = Corpus::from_spec(corpus).unwrap();
            for seed in 0..4 {
                let batch = global_batch(&corpus, l, 64, Packing::Sequential, seed, 0).unwrap();
                let s = schedule(&batch, &c).unwrap();
                check_conservation(&batch, &s, &shape);
                assert_eq!(s.stop, Stop::Balanced, "seed {seed}");
                assert!(s.max_deviation() <= DEFAULT_EPSILON + 1e-12);
            }
        }
    }

    #[test]
    fn ping_pong_splits_by_tokens_and_conserves() {
        let b = seq(&[100, 60, 50, 30, 20], 0);
        // longest first onto the lighter half: 100→0, 60→1, 50→1 (110), 30→0 (130),
        // 20→1 (130).
        assert_eq!(nano_batches(&b), [vec![0, 3], vec![1, 2, 4]]);
        let batch = [b, seq(&[300, 10], 9)];
        let [ping, pong] = schedule_ping_pong(&batch, &cfg(0.1, 16)).unwrap();
        assert_eq!(ping.samples, vec![vec![0, 3], vec![0]]);
        assert_eq!(pong.samples, vec![vec![1, 2, 4], vec![1]]);
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
            assert!(ping.samples[t.sample.server as usize].contains(&t.sample.index));
        }
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
        #[test]
        fn random_batches_conserve_and_stop_correctly(
            servers in proptest::collection::vec(
                proptest::collection::vec(1u32..2000, 0..6), 1..9),
            eps in 0.0f64..0.5,
            tile in prop_oneof![Just(1u32), Just(16), Just(128)],
        ) {
            let batch: Vec<PackedSeq> = servers
                .iter()
                .enumerate()
                .map(|(i, l)| seq(l, 100 * i as u64))
                .collect();
            let c = cfg(eps, tile);
            let s = schedule(&batch, &c).unwrap();
            check_conservation(&batch, &s, &unit());
            match s.stop {
                Stop::Balanced => prop_assert!(s.max_deviation() <= eps + 1e-9),
                Stop::NoMoveHelps => prop_assert!(s.max_deviation() > eps - 1e-9),
            }
            // Nobody crosses F̄: senders end ≥ F̄, receivers ≤ F̄.
            let ideal = s.ideal_flops / 4.0;
            for t in &s.transfers {
                prop_assert!(s.servers[t.src as usize].pairs as f64 >= ideal - 1e-6);
                prop_assert!(s.servers[t.dst as usize].pairs as f64 <= ideal + 1e-6);
            }
            prop_assert_eq!(&s, &schedule(&batch, &c).unwrap());
        }
    }
}
